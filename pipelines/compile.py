"""Compile every pipeline to YAML under pipelines/compiled/ and check each result loads back.

    python -m pipelines.compile [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml
from google.protobuf import json_format
from kfp import compiler
from kfp.pipeline_spec import pipeline_spec_pb2

from pipelines.definitions import PIPELINES

COMPILED = Path(__file__).resolve().parent / "compiled"


def compile_all(output_dir: Path = COMPILED) -> list[Path]:
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, pipeline in PIPELINES.items():
        path = output_dir / f"{name}.yaml"
        # Compiled beside, checked, then renamed over the old file: a reader (an upload, a second compile) never
        # sees a half-written or invalid pipeline.
        partial = output_dir / f".{name}.{os.getpid()}.yaml"
        try:
            compiler.Compiler().compile(pipeline_func=pipeline, package_path=str(partial))
            validate(partial)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        written.append(path)
    return written


def validate(path: Path) -> pipeline_spec_pb2.PipelineSpec:
    """Parse the compiled YAML back into KFP's PipelineSpec proto; raises if it is not a valid spec."""
    documents = list(yaml.safe_load_all(path.read_text()))
    spec = pipeline_spec_pb2.PipelineSpec()
    json_format.ParseDict(documents[0], spec)  # rejects unknown fields and wrong types
    if not spec.root.dag.tasks:
        raise ValueError(f"{path}: the pipeline has no tasks")
    for task_name, task in spec.root.dag.tasks.items():
        if task.component_ref.name not in spec.components:
            raise ValueError(f"{path}: task {task_name} refers to missing component {task.component_ref.name}")
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=COMPILED)
    args = parser.parse_args(argv)
    for path in compile_all(args.output_dir):
        print(f"compiled and validated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
