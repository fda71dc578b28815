"""How the vLLM backend lays engines over a pod's GPUs and feeds them: pure functions, no vLLM needed (the
backend itself runs in tests/gpu_paths/test_vllm_sample.py on vLLM's CPU build)."""

from __future__ import annotations

import pytest

from klear.common.config import load_config
from klear.sample.backends.base import BackendError, Request
from klear.sample.backends.vllm_engine import engine_api, engine_layout, jobs, least_loaded
from klear.sample.config import SampleConfig
from klear.sample.units import Prompt


@pytest.mark.parametrize(("gpus", "data", "tensor", "expected"), [
    (8, 8, 1, (8, 1)),  # the paper preset: an 8B model on every GPU of the pod
    (8, 1, 8, (1, 8)),  # a model that needs the whole node
    (8, 1, 0, (1, 8)),  # tensor 0: the GPUs divided among the engines
    (8, 2, 0, (2, 4)),
    (8, 0, 2, (4, 2)),  # data 0: as many engines as fit
    (8, 0, 0, (1, 8)),
    (6, 0, 4, (1, 4)),
])
def test_engines_fill_the_pod(gpus: int, data: int, tensor: int, expected: tuple[int, int]) -> None:
    assert engine_layout("cuda", gpus, data, tensor) == expected


@pytest.mark.parametrize(("gpus", "data", "tensor"), [(4, 8, 1), (8, 3, 4), (2, 0, 4), (8, 16, 0)])
def test_a_layout_the_pod_cannot_hold_is_refused_naming_the_settings(gpus: int, data: int, tensor: int) -> None:
    with pytest.raises(BackendError, match=f"data_parallel_size {data} x tensor_parallel_size {tensor} .* {gpus} GPU"):
        engine_layout("cuda", gpus, data, tensor)


@pytest.mark.parametrize(("setting", "engines", "expected"), [
    ("auto", 1, "llm_engine"),  # one engine: stepped as LLM steps it
    ("auto", 8, "async_llm"),  # vLLM's data parallelism runs through AsyncLLM only
    ("async_llm", 1, "async_llm"),
    ("llm_engine", 1, "llm_engine"),
])
def test_one_engine_is_stepped_and_several_are_fed_asynchronously(setting: str, engines: int, expected: str) -> None:
    assert engine_api(setting, engines) == expected


def test_llm_engine_with_several_engines_is_refused_naming_both_settings() -> None:
    with pytest.raises(BackendError, match="engine_api llm_engine .* data_parallel_size 8 needs async_llm"):
        engine_api("llm_engine", 8)


def test_cpu_runs_one_process_per_engine_unless_told() -> None:
    assert engine_layout("cpu", 0, 0, 0) == (1, 1) and engine_layout("cpu", 0, 2, 0) == (2, 1)


def test_paper_preset_runs_eight_single_gpu_engines_and_tiny_one() -> None:
    paper, tiny = load_config(SampleConfig, "paper"), load_config(SampleConfig, "tiny")
    assert (paper.data_parallel_size, paper.tensor_parallel_size) == (8, 1)
    assert (tiny.data_parallel_size, tiny.tensor_parallel_size) == (1, 0)


def _requests(samples: dict[str, int]) -> list[Request]:
    out = []
    for index, (pid, n) in enumerate(samples.items()):
        prompt = Prompt(id=pid, index=index, text=pid, messages=({"role": "user", "content": pid},), source="s",
                        record="{}", where=f"s:{index}", hash=pid)
        out += [Request(prompt, j, 100 * index + j) for j in range(n)]
    return out


def test_one_request_per_unit_and_per_prompt_when_greedy() -> None:
    requests = _requests({"a": 3, "b": 2})
    assert [len(job) for job in jobs(requests, 0.6)] == [1] * 5
    assert [[r.sample for r in job] for job in jobs(requests, 0.0)] == [[0, 1, 2], [0, 1]]


def test_least_loaded_engine_takes_the_next_unit() -> None:
    assert least_loaded([3, 1, 1, 2]) == 1 and least_loaded([0]) == 0 and least_loaded([2, 2]) == 0
