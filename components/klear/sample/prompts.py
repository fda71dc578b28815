"""The prompts of a sample run: read from curate outputs or record sources, in order, and checked (ids present
and unique, prompts present, no empty source); held as Arrow columns (units.Prompts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from klear.common.records import RecordError, Source, iter_training_records, unwrap_record
from klear.sample.config import SampleConfig
from klear.sample.units import Prompt, Prompts, check_unique, prompt_from_row, shipped_responses


def load_prompts(uris: Sequence[str], config: SampleConfig, with_shipped: bool = False) -> Prompts:
    """Every prompt of the sources, in order, checked: ids present and unique, prompts present, no empty source.
    `with_shipped`: the responses the records hold, required of the prompts sampled (the first max_prompts).
    Held as Arrow columns (units.Prompts), not a Python object per prompt."""
    if not uris:
        raise ValueError("no --prompts given")

    def read() -> Iterator[Prompt]:
        count = 0
        for uri in uris:
            source = Source.parse(uri)
            before = count
            for located in iter_training_records([uri]):
                prompt = prompt_from_row(located, source, count, config.prompt_field, config.id_field,
                                         config.system_prompt)
                if with_shipped and (not config.max_prompts or count < config.max_prompts):
                    prompt = dataclasses.replace(prompt, shipped=tuple(_shipped(located.record, located.where)))
                count += 1
                yield prompt
            if count == before:
                raise RecordError(f"{uri}: no prompts (an empty source); nothing to sample")

    prompts = Prompts.of(read())
    check_unique(prompts)
    return prompts


def _shipped(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    found = shipped_responses(record)
    if not found:  # curate keeps the source row as JSON in `record`: read it as every stage does
        flat = unwrap_record(record)
        found = shipped_responses(flat) if flat is not None else []
    if not found:
        raise RecordError(f"{where}: backend=records needs a response in the record (`response`, `responses`, "
                          f"`generations`, or an assistant turn in `messages`); fields present: {sorted(record)}")
    return found
