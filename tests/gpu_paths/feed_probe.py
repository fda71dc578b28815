"""The vLLM backend's feeder on vLLM's CPU engine, run by test_vllm_sample.py in a process of its own (vLLM spawns
its engine core: the caller needs a clean `__main__`). Prints one JSON object:

- `refused`: one call where a prompt is longer than max_model_len: that unit fails alone, the others are answered;
- `engine_calls`: what that call's units cost the front end besides their requests: round trips to the engine
  process for its supported tasks (asked once when the backend starts, or once per unit submitted before the first
  answer) and hand-offs to vLLM's renderer threads (token ids passed as a rendered input need none);
- `failed`: one call where the engine raises for one unit: the call ends in BackendError, every other unit it
  yielded first is a real completion, and the call returns rather than waiting on the units still in flight.

    python tests/gpu_paths/feed_probe.py MODEL
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

from klear.common.config import load_config
from klear.sample.backends.base import BackendError, Request
from klear.sample.backends.vllm_engine import VLLMBackend
from klear.sample.config import SampleConfig
from klear.sample.units import Prompt

N = 2


def requests(texts: dict[str, str]) -> list[Request]:
    out = []
    for index, (pid, text) in enumerate(texts.items()):
        prompt = Prompt(index=index, id=pid, messages=({"role": "user", "content": text},), text=text, source="probe",
                        record="{}", where=f"probe:{index + 1}", hash=pid)
        out += [Request(prompt, j, 1000 * index + j) for j in range(N)]
    return out


def count_calls(owner: Any, name: str, calls: dict[str, int]) -> None:
    """Count the calls of `owner.name` (an instance's method or attribute) from now on."""
    method = getattr(owner, name)
    calls[name] = 0

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return method(*args, **kwargs)

    setattr(owner, name, counting)


def main(model: str) -> None:
    config = load_config(SampleConfig, "tiny-vllm-cpu", ["max_tokens=16", "max_model_len=128", f"n={N}"])
    texts = {f"q{i}": f"What is {i} + {i + 3}?" for i in range(6)}
    result: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        backend = VLLMBackend(model, config, stack)
        stack.callback(backend.close)

        calls: dict[str, int] = {}
        count_calls(backend.engine.engine_core, "get_supported_tasks_async", calls)
        count_calls(backend.engine.input_processor, "process_inputs_async", calls)
        answers = list(backend.generate(requests({**texts, "long": "word " * 400})))
        result["engine_calls"] = calls
        result["refused"] = sorted((a.request.prompt.id, a.request.sample, a.ok, a.error_kind) for a in answers)

        generate = backend.engine.generate

        def failing(prompt: Any, params: Any, request_id: str, **kwargs: Any) -> Any:
            if request_id.endswith("-q3#1"):
                raise RuntimeError("engine core died")
            return generate(prompt, params, request_id, **kwargs)

        backend.engine.generate = failing
        yielded: list[tuple[str, int, bool]] = []
        started = time.monotonic()
        try:
            for answer in backend.generate(requests(texts)):
                yielded.append((answer.request.prompt.id, answer.request.sample, answer.ok))
            result["failed"] = {"error": None}
        except BackendError as exc:
            result["failed"] = {"error": str(exc)}
        result["failed"].update(yielded=yielded, seconds=time.monotonic() - started)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
