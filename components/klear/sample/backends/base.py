"""What a backend is given and what it returns."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from klear.sample.reasoning import Parsed
from klear.sample.units import Prompt


class BackendError(RuntimeError):
    """A backend that cannot run at all (unreachable endpoint, refused key, not a model): the run stops."""


@dataclass(frozen=True, slots=True)
class Request:
    prompt: Prompt
    sample: int
    seed: int | None  # None: unseeded (seed_per_unit false)


@dataclass(frozen=True, slots=True)
class Completion:
    request: Request
    parsed: Parsed | None  # None when the unit failed
    finish_reason: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model: str = ""
    attempts: int = 1
    error_kind: str = ""  # failed units: timeout, connection, http_429, http_500, no_choices, empty_answer, ...
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.parsed is not None


class Backend(Protocol):
    name: str

    def identity(self) -> dict[str, Any]:
        """What, besides the sampling parameters, decides what is sampled: part of the settings hash."""
        ...

    def describe(self) -> dict[str, Any]:
        """Everything about the backend worth recording in report.json (never a secret)."""
        ...

    def generate(self, requests: Sequence[Request]) -> Iterator[Completion]:
        ...

    def close(self) -> None:
        ...
