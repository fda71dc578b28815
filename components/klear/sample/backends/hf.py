"""transformers `generate` on CPU (or one GPU): the tests' and the demo's engine. torch is imported lazily.

The pending samples of one prompt decode together, one batch row each, and each row draws its tokens from its
own generator seeded with the unit's seed: a unit's sample does not depend on what else is pending, so a restart
reproduces what an uninterrupted run would have produced, and the rows share the prompt's forward passes
(seed_per_unit false: each row's generator is seeded from torch's entropy instead).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from importlib import metadata
from typing import Any

from klear.sample import reasoning
from klear.sample.backends.base import BackendError, Completion, Request
from klear.sample.config import SampleConfig
from klear.sample.model_folder import local_model, model_identity


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
        self._identity = model_identity(model, self.path, manifest)
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
        for _, group in itertools.groupby(requests, key=lambda r: r.prompt.id):
            yield from self._generate_group(list(group))

    def _processors(self) -> Any:
        """transformers' own logits processors for what is not sampling proper: the repetition penalty, and the
        model's generation-config token biases (`sequence_bias`), as `generate` would apply them."""
        from transformers.generation.logits_process import (
            LogitsProcessorList,
            RepetitionPenaltyLogitsProcessor,
            SequenceBiasLogitsProcessor,
        )

        processors = LogitsProcessorList()
        if self.config.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(penalty=self.config.repetition_penalty))
        bias = getattr(self.model.generation_config, "sequence_bias", None)
        if bias:
            pairs = bias.items() if isinstance(bias, dict) else bias
            processors.append(SequenceBiasLogitsProcessor(sequence_bias=[[list(k), float(v)] for k, v in pairs]))
        return processors

    def _generate_group(self, group: list[Request]) -> Iterator[Completion]:
        """One prompt's pending samples: a batched decode with a KV cache, one generator per row (seeded with the
        unit's seed; an unseeded unit's from torch's entropy)."""
        torch, config = self.torch, self.config
        ids = self._encode(group[0])
        sequences = ids.repeat(len(group), 1)
        processors = self._processors()
        generators = [torch.Generator(device=self.device) for _ in group]
        for generator, request in zip(generators, group, strict=True):
            if request.seed is None:
                generator.seed()
            else:
                generator.manual_seed(request.seed)
        tokens: list[list[int]] = [[] for _ in group]
        finished = [False] * len(group)
        past, step_input = None, sequences
        with torch.inference_mode():
            for _ in range(config.max_tokens):
                out = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = processors(sequences, out.logits[:, -1, :].float())
                picked = [next_token(torch, row, config.temperature, config.top_p, config.top_k, generators[i])
                          for i, row in enumerate(logits)]
                for i, token in enumerate(picked):
                    if not finished[i]:
                        tokens[i].append(token)
                        finished[i] = token in self.eos_ids
                if all(finished):
                    break
                step_input = torch.tensor(picked, device=self.device).unsqueeze(1)
                sequences = torch.cat([sequences, step_input], dim=1)
        for request, row in zip(group, tokens):
            finish = finish_reason(row, self.eos_ids, config.max_tokens)
            body = row[:-1] if finish == "stop" and row and row[-1] in self.eos_ids else row
            text = self.tokenizer.decode(body, skip_special_tokens=True)
            yield Completion(request=request, parsed=reasoning.from_text(text), finish_reason=finish,
                             prompt_tokens=int(ids.shape[1]), completion_tokens=len(row), model=self.model_name)

    def close(self) -> None:
        self._prompt_ids.clear()


def next_token(torch: Any, logits: Any, temperature: float, top_p: float, top_k: int, generator: Any) -> int:
    """One token from one row's logits: greedy at temperature 0, else temperature, top-k (0: off) and nucleus
    top-p filtering, then a draw from the row's own generator."""
    if temperature <= 0:
        return int(logits.argmax())
    scaled = logits / temperature
    if top_k > 0:
        kth = torch.topk(scaled, min(top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        outside = ordered.cumsum(-1) - ordered > top_p  # keep the smallest prefix whose mass reaches top_p
        probs = probs.clone()
        probs[order[outside]] = 0.0
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator))


def storage_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] or uri
