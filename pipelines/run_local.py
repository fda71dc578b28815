"""Run a compiled pipeline end to end on this machine with kfp.local (no cluster, CPU).

    python -m pipelines.run_local klear-curate --workdir runs/curate [--run-root s3://bucket/runs] [--arg k=v ...]
        [--cache]

Runs the YAML under pipelines/compiled/ (compile first: `make pipeline`), exactly what the
cluster runs, with kfp.local's SubprocessRunner in this Python environment. Each run gets a fresh
run id (KLEAR_RUN_ID, what a cluster takes from the pod's pipeline/runid label), so stage outputs
land in <run_root>/<run id>/<stage>. With --cache, a task whose inputs and settings are unchanged
since an earlier run with the same workdir reuses that run's outputs (the deterministic stages).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import yaml

from klear.common import storage
from klear.common.kfp_io import RUN_ID_ENV, URI_KEY
from pipelines.compile import COMPILED


def new_run_id() -> str:
    return f"local-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def run_compiled(name: str, workdir: Path, arguments: dict[str, Any], compiled_dir: Path = COMPILED,
                 cache: bool = False) -> Any:
    """Run a compiled pipeline under kfp.local with a fresh run id; `cache` reuses unchanged tasks' outputs
    from earlier runs in the same workdir."""
    from kfp import components, local

    # Expected under kfp.local: cluster-only settings are ignored and stage images are not pulled.
    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
    warnings.filterwarnings("ignore", message=".*custom or non-Python base image.*")
    path = compiled_dir / f"{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: compile the pipelines first (make pipeline)")
    workdir.mkdir(parents=True, exist_ok=True)
    keep_task_outputs_in_loops()
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(workdir.resolve() / "kfp"),
               raise_on_error=True, enable_caching=cache)
    pipeline = components.load_component_from_file(str(path))
    previous = os.environ.get(RUN_ID_ENV)
    os.environ[RUN_ID_ENV] = new_run_id()  # the tasks are subprocesses: they inherit it
    try:
        return pipeline(**as_declared(arguments, pipeline.component_spec.inputs or {}))
    finally:
        if previous is None:
            os.environ.pop(RUN_ID_ENV, None)
        else:
            os.environ[RUN_ID_ENV] = previous


def keep_task_outputs_in_loops() -> None:
    """kfp.local (2.17) replaces *every* task-output parameter that flows into a ParallelFor with the loop item,
    not only the loop's items (the compiled YAML is right; a cluster resolves it correctly): e.g. the evaluation
    prompts' sampling overrides would reach each sample slice as "0/1". Keep such inputs as the YAML says, so
    kfp.local resolves them from the producing task like any other. Idempotent."""
    from kfp.local.orchestrator import task_spec_utils

    original = task_spec_utils.create_parameter_loop_iteration_task_spec
    if getattr(original, "keeps_task_outputs", False):
        return

    def iteration_spec(task_spec: Any, loop_item: Any, loop_task_name: str) -> Any:
        spec = original(task_spec, loop_item, loop_task_name)
        items = task_spec.parameter_iterator.items.input_parameter if task_spec.HasField("parameter_iterator") else ""
        for name, given in task_spec.inputs.parameters.items():
            if given.HasField("task_output_parameter") and name != items:
                spec.inputs.parameters[name].CopyFrom(given)
        return spec

    iteration_spec.keeps_task_outputs = True  # type: ignore[attr-defined]
    task_spec_utils.create_parameter_loop_iteration_task_spec = iteration_spec


def as_declared(arguments: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """Numbers given for string parameters as strings: `--arg gpus_per_node=0` reads 0 as a number, while the
    pipelines take resources as strings (what the KFP driver resolves into a pod's resources)."""
    def fits(name: str, value: Any) -> Any:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return str(value) if number and getattr(inputs.get(name), "type", None) == "String" else value

    return {name: fits(name, value) for name, value in arguments.items()}


def _summary(artifact: Any) -> str:
    """For the console: a stage output's report.md, or else its metrics.json; an output that is a file of its
    own (the Markdown summary klear-evaluate returns), that file."""
    recorded = artifact.metadata.get(URI_KEY)
    if not recorded:
        own = Path(artifact.path)
        return own.read_text() if own.is_file() else ""
    for name in ("report.md", "metrics.json"):
        with contextlib.suppress(FileNotFoundError):
            return storage.read_bytes(storage.Uri.parse(recorded).join(name)).decode()
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", help="compiled pipeline name, e.g. klear-sft-data")
    parser.add_argument("--workdir", type=Path, default=Path("runs/local"))
    parser.add_argument("--run-root", default="", help="where stages publish (path or s3://); default: <workdir>/outputs")
    parser.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE", help="pipeline argument (YAML value)")
    parser.add_argument("--cache", action="store_true", help="reuse unchanged tasks' outputs of earlier runs")
    parser.add_argument("--compiled", type=Path, default=COMPILED, help="folder of the compiled pipelines")
    args = parser.parse_args(argv)
    arguments: dict[str, Any] = {"run_root": args.run_root or str((args.workdir / "outputs").resolve())}
    for item in args.arg:
        key, _, value = item.partition("=")
        arguments[key] = yaml.safe_load(value)
    task = run_compiled(args.pipeline, args.workdir, arguments, args.compiled, cache=args.cache)
    output = task.outputs if not hasattr(task, "output") else {"output": task.output}
    for name, artifact in output.items():
        location = artifact.metadata.get("uri", artifact.uri)
        print(f"\n{name}: {location}")
        print(json.dumps({k: v for k, v in artifact.metadata.items() if k != "uri"}))
        summary = _summary(artifact)
        if summary:
            print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
