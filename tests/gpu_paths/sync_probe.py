"""The weight sync as GPPO runs it (a colocated vLLM engine, `external_launcher` as TRL starts it), with the policy
changed between syncs: prints the log-prob gaps as JSON. A process of its own (vLLM needs torch.distributed set up
and a clean `__main__`).

    python -m tests.gpu_paths.sync_probe MODEL
"""

from __future__ import annotations

import json
import os
import sys


def main(model_dir: str) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM

    from klear.gppo.trainer import sync_probe
    from klear.gppo.vllm_sync import logprob_gap, push_weights

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    torch.distributed.init_process_group("gloo")
    llm = LLM(model=model_dir, distributed_executor_backend="external_launcher", enforce_eager=True, seed=0,
              max_model_len=512, logprobs_mode="processed_logprobs")
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt, completion = sync_probe(AutoTokenizer.from_pretrained(model_dir))
    gaps = {"loaded": logprob_gap(llm, policy, prompt, completion)}
    with torch.no_grad():  # an update's worth of change in every matrix, the output layer included
        generator = torch.Generator().manual_seed(0)
        for name, param in policy.named_parameters():
            if os.environ.get("PROBE_ONLY") and os.environ["PROBE_ONLY"] not in name:
                continue
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    gaps["stale"] = logprob_gap(llm, policy, prompt, completion)
    push_weights(llm, policy.named_parameters())
    gaps["synced"] = logprob_gap(llm, policy, prompt, completion)
    return gaps


if __name__ == "__main__":
    print("GAPS " + json.dumps(main(sys.argv[1])), flush=True)
