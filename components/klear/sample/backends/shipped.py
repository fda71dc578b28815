"""backend=records: responses the prompt records already hold (sources that ship R1 traces) become the same
output as sampled ones, without sampling them again."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from klear.sample import reasoning
from klear.sample.backends.base import Completion, Request


class ShippedBackend:
    name = "records"

    def identity(self) -> dict[str, Any]:
        return {"engine": "records"}

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "note": "responses imported from the records, not sampled; token counts unknown"}

    def generate(self, requests: Sequence[Request]) -> Iterator[Completion]:
        for request in requests:
            item = request.prompt.shipped[request.sample]
            given = item.get("finish_reason")
            parsed = reasoning.from_message(item, given if isinstance(given, str) else None)
            # A trace cut inside its reasoning was cut by a token limit.
            finish = given if isinstance(given, str) else ("stop" if parsed.closed else "length")
            yield Completion(request=request, parsed=parsed, finish_reason=finish, model=str(item.get("model") or ""))

    def close(self) -> None:
        pass
