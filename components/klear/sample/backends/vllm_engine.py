"""vLLM offline on the pod's GPUs: the only vLLM-specific code. vllm (and torch) are imported lazily.

All missing samples of a prompt go in one request (SamplingParams(n=k, seed=...)); prompts go in chunks of
`batch_prompts`, so completed units are written out between chunks. Prefix caching shares the prompt's KV
cache between its samples. Output fields per vLLM 0.31: outputs[i].outputs[j].text / .token_ids /
.finish_reason, outputs[i].prompt_token_ids.
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
            import torch
            from vllm import LLM
        except ImportError as exc:
            raise BackendError(f"backend vllm needs the vllm package (GPU image): {exc}") from None
        gpus = config.tensor_parallel_size or torch.cuda.device_count()
        if gpus < 1:
            raise BackendError("backend vllm needs a GPU; use backend=hf on CPU")
        self.engine_args: dict[str, Any] = {
            "model": str(self.path), "tensor_parallel_size": gpus, "enable_prefix_caching": True,
            "gpu_memory_utilization": config.gpu_memory_utilization, "seed": config.seed,
            **({"max_model_len": config.max_model_len} if config.max_model_len else {}), **config.engine_kwargs,
        }
        self.llm = LLM(**self.engine_args)
        self.model_name = model.rstrip("/").rsplit("/", 1)[-1]

    def identity(self) -> dict[str, Any]:
        return self._identity

    def describe(self) -> dict[str, Any]:
        args = {k: v for k, v in self.engine_args.items() if k != "model"}
        return {"backend": self.name, "model": self.uri, "engine_args": args,
                "versions": {p: metadata.version(p) for p in ("vllm", "torch", "transformers")}}

    def generate(self, requests: Sequence[Request]) -> Iterator[Completion]:
        from vllm import SamplingParams

        config = self.config
        groups = [list(g) for _, g in groupby(requests, key=lambda r: r.prompt.id)]
        for start in range(0, len(groups), config.batch_prompts):
            chunk = groups[start:start + config.batch_prompts]
            params = [SamplingParams(n=len(group), seed=group[0].seed, temperature=config.temperature,
                                     top_p=config.top_p, top_k=config.top_k or -1,
                                     repetition_penalty=config.repetition_penalty, max_tokens=config.max_tokens)
                      for group in chunk]
            outputs = self.llm.chat([list(group[0].prompt.messages) for group in chunk], sampling_params=params,
                                    use_tqdm=False)
            for group, output in zip(chunk, outputs, strict=True):
                for request, completion in zip(group, output.outputs, strict=True):
                    yield Completion(request=request, parsed=reasoning.from_text(completion.text),
                                     finish_reason=completion.finish_reason or "unknown",
                                     prompt_tokens=len(output.prompt_token_ids or ()),
                                     completion_tokens=len(completion.token_ids), model=self.model_name)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            del self.llm
