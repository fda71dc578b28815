"""Stage 5, gppo: reinforcement learning with Gradient-Preserving clipping Policy Optimization.

losses.py and advantages.py hold the algorithm as pure tensor code; the trainer (a TRL
GRPOTrainer subclass), rewards and the stage entry point build on them.
"""
