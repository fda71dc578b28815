"""Under kfp.local (as run_local runs it), a task inside a ParallelFor receives another task's output parameter
as that task produced it, not the loop item: what the sample slices of an evaluation rely on (the protocol's
sampling overrides come from the evaluation-prompts task)."""

# No `from __future__ import annotations`: KFP reads the components' types at definition.
from pathlib import Path

from kfp import dsl, local

from pipelines.run_local import keep_task_outputs_in_loops


@dsl.component(base_image="python:3.11")
def parts(count: int) -> list:
    return [f"{i}/{count}" for i in range(count)]


@dsl.component(base_image="python:3.11")
def settings() -> list:
    return ["temperature=0.6", "n=4"]


@dsl.component(base_image="python:3.11")
def use(part: str, overrides: list) -> str:
    return f"{part}: {','.join(overrides)}"


@dsl.component(base_image="python:3.11")
def gather(results: list) -> str:
    return ";".join(sorted(results))


@dsl.pipeline
def loop_with_a_task_output() -> str:
    slices = parts(count=2)
    given = settings()
    with dsl.ParallelFor(slices.output) as part:
        used = use(part=part, overrides=given.output)
    return gather(results=dsl.Collected(used.output)).output


def test_a_task_output_reaches_the_loop_body_unchanged(tmp_path: Path) -> None:
    keep_task_outputs_in_loops()
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)
    run = loop_with_a_task_output()
    assert run.output == "0/2: temperature=0.6,n=4;1/2: temperature=0.6,n=4"
