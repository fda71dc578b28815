"""transformers `generate` on CPU (or one GPU): the tests' and the demo's engine. torch is imported lazily.

One generate call per unit, seeded with the unit's seed, so a unit's sample does not depend on what else is
pending: a restart reproduces exactly what an uninterrupted run would have produced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from importlib import metadata
from typing import Any

from klear.sample import reasoning
from klear.sample.backends.base import BackendError, Completion, Request
from klear.sample.config import SampleConfig
from klear.sample.model_folder import chat_template, fingerprint, local_model
from klear.sample.units import canonical_hash


def finish_reason(tokens: Sequence[int], eos_ids: set[int], max_tokens: int) -> str:
    if tokens and tokens[-1] in eos_ids:
        return "stop"
    return "length" if len(tokens) >= max_tokens else "stop"


class HFBackend:
    name = "hf"

    def __init__(self, model: str, config: SampleConfig, stack: contextlib.ExitStack) -> None:
        self.uri = model
        self.config = config
        self.path, manifest = local_model(model, stack)
        self._identity = {"engine": "model", "model": fingerprint(self.path, manifest),
                          "chat_template": canonical_hash(chat_template(self.path))}
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            self.model = AutoModelForCausalLM.from_pretrained(
                self.path, dtype=torch.bfloat16 if self.device == "cuda" else torch.float32).to(self.device).eval()
        except (OSError, ValueError, KeyError) as exc:
            raise BackendError(f"--model {model}: transformers cannot load it: {exc}") from None
        gen_eos = self.model.generation_config.eos_token_id
        eos = {self.tokenizer.eos_token_id} | set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        self.eos_ids = {int(e) for e in eos if e is not None}
        if not self.eos_ids:
            raise BackendError(f"--model {model}: neither the tokenizer nor the generation config names an EOS token")
        self.model_name = storage_name(model)
        self._prompt_ids: dict[str, Any] = {}

    def identity(self) -> dict[str, Any]:
        return self._identity

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.uri, "device": self.device,
                "eos_tokens": sorted(self.tokenizer.convert_ids_to_tokens(sorted(self.eos_ids))),
                "versions": {p: metadata.version(p) for p in ("torch", "transformers")}}

    def _encode(self, request: Request) -> Any:
        prompt = request.prompt
        ids = self._prompt_ids.get(prompt.id)
        if ids is None:
            text = self.tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=False)
            ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"].to(self.device)
            self._prompt_ids = {prompt.id: ids}  # units come in prompt order: keep the current prompt only
        return ids

    def generate(self, requests: Sequence[Request]) -> Iterator[Completion]:
        torch, config = self.torch, self.config
        sampling: dict[str, Any] = {"do_sample": config.temperature > 0}
        if config.temperature > 0:
            sampling.update(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)
        for request in requests:
            ids = self._encode(request)
            torch.manual_seed(request.seed)
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=config.max_tokens,
                    repetition_penalty=config.repetition_penalty, eos_token_id=sorted(self.eos_ids),
                    pad_token_id=self.tokenizer.pad_token_id or sorted(self.eos_ids)[0], **sampling)
            tokens = out[0, ids.shape[1]:].tolist()
            finish = finish_reason(tokens, self.eos_ids, config.max_tokens)
            body = tokens[:-1] if finish == "stop" and tokens and tokens[-1] in self.eos_ids else tokens
            text = self.tokenizer.decode(body, skip_special_tokens=True)
            yield Completion(request=request, parsed=reasoning.from_text(text), finish_reason=finish,
                             prompt_tokens=int(ids.shape[1]), completion_tokens=len(tokens), model=self.model_name)

    def close(self) -> None:
        self._prompt_ids.clear()


def storage_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] or uri
