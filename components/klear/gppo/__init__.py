"""gppo: reinforcement learning with Gradient-Preserving clipping Policy Optimization (math RL, then code RL).

losses.py (the policy losses) and batching.py (which groups a step trains on) hold the algorithm as pure
tensor code; trainer.py subclasses TRL's GRPOTrainer, which computes the group-relative advantages (paper
Eq. 4); rewards.py scores rollouts; stage.py is the entry point on the shared training skeleton.
"""
