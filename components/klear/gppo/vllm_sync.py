"""The policy's weights into the colocated vLLM engine, and the check that they arrived.

TRL 1.16 pushes weights with `model.load_weights([(name, tensor)])` one tensor at a time. On vLLM's CPU build that
fails (`'Parameter' object has no attribute 'weight_loader'`: linear weights are repacked for oneDNN after loading
and `layer.weight` is gone). vLLM's own in-place reload (`model_runner.reload_weights(weights_iterator=...)`)
restores the checkpoint layout, loads, and repacks again, on CPU and GPU alike; a tied output layer, which loads
nothing of its own, is repacked from the new embeddings afterwards (tests/gpu_paths/test_gppo_vllm.py checks both
kinds of model).

A sync that leaves vLLM on old weights trains on rollouts of another policy without any error: `logprob_gap`
compares vLLM's log-probabilities of a fixed completion with the policy's, and the trainer runs it after every
sync when `vllm_sync_tolerance` > 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any


class WeightSyncError(RuntimeError):
    """vLLM does not hold the policy's weights after a sync."""


def push_weights(llm: Any, named_params: Iterable[tuple[str, Any]]) -> None:
    """The policy's parameters (checkpoint names, full tensors) into a colocated vLLM engine, in place."""
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=named_params)
    refresh_tied_output_layer(runner.get_model())
    llm.reset_prefix_cache()


def refresh_tied_output_layer(model: Any) -> None:
    """A tied output layer loads no weights of its own, so the reload leaves it as it was; its weight is the
    embeddings' (updated in place), but vLLM's CPU build may compute it from a packed copy made at load (the
    small-GEMM kernel on AVX-512/AMX CPUs), which would stay on the old embeddings. Its processing runs again to
    repack from the new ones (a no-op on GPU)."""
    lm_head: Any = getattr(model, "lm_head", None)
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False) and hasattr(lm_head, "quant_method"):
        lm_head.quant_method.process_weights_after_loading(lm_head)


def logprob_gap(llm: Any, policy: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                policy_logprobs: Callable[[list[int], int], Any] | None = None) -> float:
    """The largest |log p_vLLM - log p_policy| over the completion's tokens, given the prompt (temperature 1).
    `policy_logprobs(ids, n)`: the policy's log-probs of the last n of `ids` (a 1-D tensor), when the policy must
    be run its trainer's way (ZeRO-3); else a plain forward of `policy`."""
    import torch
    from vllm import SamplingParams

    ids = [*prompt_ids, *completion_ids]
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    output = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]  # raw log-probs: no temperature
    served = [output.prompt_logprobs[p][ids[p]].logprob for p in range(len(prompt_ids), len(ids))]
    if policy_logprobs is not None:
        own = policy_logprobs(ids, len(completion_ids)).float().cpu()
    else:
        device = next(policy.parameters()).device
        with torch.no_grad():
            logits = policy(input_ids=torch.tensor([ids], device=device)).logits[0, :-1].float()
        own = torch.log_softmax(logits, dim=-1)[len(prompt_ids) - 1:].gather(
            -1, torch.tensor(ids[len(prompt_ids):], device=device).unsqueeze(-1)).squeeze(-1).cpu()
    return float((own - torch.tensor(served)).abs().max())
