"""The vLLM backend's feeding on vLLM's CPU engine, through one engine API (`llm_engine` or `async_llm`), run by
test_vllm_sample.py in a process of its own (vLLM spawns its engine core: the caller needs a clean `__main__`).
Places for 2 prompts' units (batch_prompts 2), so a call's units go in over several rounds. Prints one JSON object:

- `engine_api`: the API the backend drove;
- `refused`: one call where a prompt is longer than max_model_len: that unit fails alone, the others are answered;
- `engine_calls` (async_llm): what that call's units cost the front end besides their requests: round trips to the
  engine process for its supported tasks (asked once when the backend starts, or once per unit submitted before
  the first answer) and hand-offs to vLLM's renderer threads (token ids passed as a rendered input need none);
- `failed`: one call where the engine raises for one unit (async_llm: its request; llm_engine: adding it): the
  call ends in BackendError, every unit it yielded first is a real completion, and the call returns rather than
  waiting on the units still in flight;
- `step_failed` (llm_engine): the same when the engine's step raises once some units have finished.

    python tests/gpu_paths/feed_probe.py MODEL llm_engine|async_llm
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


def failing_call(backend: VLLMBackend, texts: dict[str, str]) -> dict[str, Any]:
    """One call of the backend over `texts`' units, stopped by whatever the caller made fail."""
    yielded: list[tuple[str, int, bool]] = []
    started = time.monotonic()
    result: dict[str, Any] = {"error": None}
    try:
        for answer in backend.generate(requests(texts)):
            yielded.append((answer.request.prompt.id, answer.request.sample, answer.ok))
    except BackendError as exc:
        result["error"] = str(exc)
    return {**result, "yielded": yielded, "seconds": time.monotonic() - started}


def main(model: str, api: str) -> None:
    config = load_config(SampleConfig, "tiny-vllm-cpu",
                         ["max_tokens=16", "max_model_len=128", f"n={N}", "batch_prompts=2", f"engine_api={api}"])
    texts = {f"q{i}": f"What is {i} + {i + 3}?" for i in range(6)}
    result: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        backend = VLLMBackend(model, config, stack)
        stack.callback(backend.close)
        engine = backend.engine
        result["engine_api"] = backend.describe()["engine_api"]

        calls: dict[str, int] = {}
        if api == "async_llm":
            count_calls(engine.engine_core, "get_supported_tasks_async", calls)
            count_calls(engine.input_processor, "process_inputs_async", calls)
        answers = list(backend.generate(requests({**texts, "long": "word " * 400})))
        result["engine_calls"] = calls
        result["refused"] = sorted((a.request.prompt.id, a.request.sample, a.ok, a.error_kind) for a in answers)

        if api == "async_llm":
            generate = engine.generate

            def failing(prompt: Any, params: Any, request_id: str, **kwargs: Any) -> Any:
                if request_id.endswith("-q3#1"):
                    raise RuntimeError("engine core died")
                return generate(prompt, params, request_id, **kwargs)

            engine.generate = failing
            result["failed"] = failing_call(backend, texts)
            engine.generate = generate
        else:
            add_request, step = engine.add_request, engine.step

            def failing_add(request_id: str, *args: Any, **kwargs: Any) -> Any:
                if request_id.endswith("-q3#1"):
                    raise RuntimeError("engine core died")
                return add_request(request_id, *args, **kwargs)

            engine.add_request = failing_add
            result["failed"] = failing_call(backend, texts)
            engine.add_request = add_request
            finished = [0]

            def failing_step() -> Any:
                if finished[0]:
                    raise RuntimeError("engine core died")
                outputs = step()
                finished[0] += sum(1 for output in outputs if output.finished)
                return outputs

            engine.step = failing_step
            result["step_failed"] = failing_call(backend, texts)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
