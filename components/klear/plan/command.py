"""`klear plan PIPELINE`: check a compiled pipeline's arguments against the cluster and models it will run on.

    klear plan klear-reasoner --cluster h100-80gb-x8 --arg gppo_code_overrides='["eps_high=0.3"]' --format json

PIPELINE is a compiled pipeline file, or a name looked up as pipelines/compiled/<name>.yaml under the current
folder. Its parameters' defaults come from the compiled spec; `--arg NAME=VALUE` (a YAML/JSON value, as
`python -m pipelines.run_local` takes it) overrides one. Exit 0 when every check passes, 1 when one fails.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from klear.cli import STAGES
from klear.common.config import StageConfig
from klear.plan import checks, shapes
from klear.plan.checks import PROMPT_BUDGET_TOKENS, Check

COMPILED = Path("pipelines") / "compiled"
CHART_VALUES = Path("charts") / "klear-reasoner" / "values.yaml"  # the chart's own, where the checkout has it
DEFAULT_NODES = (1, 2, 4, 8)
# The paper's models, by role (shapes/<name>.yaml): the teacher behind the chart's server, the reference model,
# and the base model whose SFT and RL policies keep its config.json.
TEACHER, REFERENCE, POLICY = "deepseek-r1-0528", "qwen3-8b", "qwen3-8b-base"

CONFIGS = {stage: f"klear.{stage.replace('-', '_')}.config" for stage in STAGES}
CLASSES = {"curate": "CurateConfig", "sample": "SampleConfig", "judge": "JudgeConfig", "sft-data": "SftDataConfig",
           "sft": "SftConfig", "rl-filter": "RlFilterConfig", "gppo": "GppoConfig", "evaluate": "EvaluateConfig"}
# The recipe's settings: (stage, preset parameter, overrides parameter), in the order the stages run.
RECIPE_SETTINGS = (
    ("curate", "curate_preset", "curate_overrides"),
    ("sample", "sample_preset", "teacher_overrides"),
    ("sample", "sample_preset", "reference_overrides"),
    ("sample", "sample_preset", "filter_math_overrides"),
    ("sample", "sample_preset", "filter_code_overrides"),
    ("sft-data", "sft_data_preset", "sft_data_overrides"),
    ("sft", "sft_preset", "sft_overrides"),
    ("rl-filter", "rl_filter_preset", "rl_filter_math_overrides"),
    ("rl-filter", "rl_filter_preset", "rl_filter_code_overrides"),
    ("gppo", "gppo_math_preset", "gppo_math_overrides"),
    ("gppo", "gppo_code_preset", "gppo_code_overrides"),
    ("evaluate", "evaluate_preset", "evaluate_overrides"),
    ("sample", "sample_preset", "eval_sample_overrides"),
)


def config_class(stage: str) -> type[StageConfig]:
    return getattr(importlib.import_module(CONFIGS[stage]), CLASSES[stage])


# --------------------------------------------------------------------------- the pipeline's arguments


def pipeline_file(name: str) -> Path:
    """A compiled pipeline: a file, or pipelines/compiled/<name>.yaml under the current folder."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or "/" in name:
        if not path.is_file():
            raise ValueError(f"compiled pipeline not found: {name}")
        return path
    found = COMPILED / f"{name}.yaml"
    if not found.is_file():
        known = sorted(p.stem for p in COMPILED.glob("*.yaml")) if COMPILED.is_dir() else []
        raise ValueError(f"no compiled pipeline {name!r} at {found} (compile with `python -m pipelines.compile`)"
                         + (f"; compiled: {', '.join(known)}" if known else ""))
    return found


def pipeline_parameters(path: Path) -> tuple[str, dict[str, Any]]:
    """The pipeline's name and its parameters' defaults (root.inputDefinitions.parameters.<name>.defaultValue;
    None where a parameter has none)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the ~500 KB recipe spec in a fraction of a second
    try:
        spec: Any = next(iter(yaml.load_all(path.read_text(), Loader=loader)), None)
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not a compiled pipeline: {exc}") from None
    try:
        parameters = spec["root"]["inputDefinitions"]["parameters"]
        name = spec["pipelineInfo"]["name"]
    except (KeyError, TypeError):
        raise ValueError(f"{path}: not a compiled pipeline (no root.inputDefinitions.parameters)") from None
    return name, {key: value.get("defaultValue") for key, value in parameters.items()}


def apply_arguments(defaults: Mapping[str, Any], items: list[str]) -> dict[str, Any]:
    """`defaults` with `--arg NAME=VALUE` items applied (VALUE as YAML, as run_local reads it); an unknown name is
    refused by name."""
    values = dict(defaults)
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--arg {item!r} is not of the form NAME=VALUE")
        if key not in values:
            raise ValueError(f"--arg {key}: the pipeline has no parameter {key!r}; parameters: {', '.join(sorted(values))}")
        try:
            values[key] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(f"--arg {key}: invalid YAML value {raw!r}: {exc}") from None
    return values


def settings_uses(pipeline: str, params: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(stage, preset parameter, overrides parameter) of each config the pipeline loads."""
    uses = [use for use in RECIPE_SETTINGS if use[1] in params and use[2] in params]
    if not uses and "preset" in params and "overrides" in params:  # a single-stage pipeline
        uses = [(stage, "preset", "overrides") for stage, info in STAGES.items() if pipeline in info.pipelines]
    return uses


def _length_from(max_model_len: int, model: str) -> str:
    return "max_model_len" if max_model_len else f"max_model_len 0 = {model}'s positions:"


def teacher_length(values_file: Path | None) -> tuple[int | None, str]:
    """The chart's teacher.maxModelLen and where it was read; None without chart values."""
    if values_file is None:
        return None, ""
    try:
        values = yaml.safe_load(values_file.read_text()) or {}
        length = values["teacher"]["maxModelLen"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ValueError(f"chart values {values_file}: no teacher.maxModelLen ({exc})") from None
    if not isinstance(length, int) or isinstance(length, bool):
        raise ValueError(f"chart values {values_file}: teacher.maxModelLen is not a number: {length!r}")
    return length, f"{values_file}: teacher.maxModelLen"


# --------------------------------------------------------------------------- the plan


def plan(pipeline: str, params: Mapping[str, Any], cluster: shapes.Cluster, values_file: Path | None,
         nodes: list[int] | None) -> tuple[list[Check], dict[str, Any]]:
    """Every check of the pipeline's arguments on `cluster`, and the estimates beside them."""
    found: list[Check] = []
    configs: dict[str, Any] = {}
    for stage, preset_param, overrides_param in settings_uses(pipeline, params):
        check, config = checks.settings_check(stage, config_class(stage), preset_param, params[preset_param],
                                              overrides_param, params[overrides_param])
        found.append(check)
        configs[overrides_param] = config

    teacher, reference, policy = shapes.model(TEACHER), shapes.model(REFERENCE), shapes.model(POLICY)
    if configs.get("teacher_overrides") is not None:
        sampling = configs["teacher_overrides"]
        if params.get("teacher_model_uri"):  # vLLM in the slice pods, not the chart's server
            found.append(checks.context_check("sample", "teacher_overrides engine",
                                              sampling.max_model_len or teacher.max_position_embeddings,
                                              _length_from(sampling.max_model_len, teacher.name), PROMPT_BUDGET_TOKENS, sampling.max_tokens,
                                              "teacher_overrides max_tokens", teacher.max_position_embeddings,
                                              teacher.name))
        else:
            length, origin = teacher_length(values_file)
            found.append(Check("sample", "context: teacher_overrides server", True,
                               "not checked: no chart values here (give --values FILE)") if length is None else
                         checks.context_check("sample", "teacher_overrides server", length, origin,
                                              PROMPT_BUDGET_TOKENS, sampling.max_tokens,
                                              "teacher_overrides max_tokens", teacher.max_position_embeddings,
                                              teacher.name))
    if configs.get("reference_overrides") is not None:
        sampling = configs["reference_overrides"]
        found.append(checks.context_check("sample", "reference_overrides engine",
                                          sampling.max_model_len or reference.max_position_embeddings,
                                          _length_from(sampling.max_model_len, reference.name), PROMPT_BUDGET_TOKENS, sampling.max_tokens,
                                          "reference_overrides max_tokens", reference.max_position_embeddings,
                                          reference.name))
    for param in ("gppo_math_overrides", "gppo_code_overrides", "overrides"):
        if isinstance(configs.get(param), checks.GppoConfig):
            found.append(checks.gppo_context("gppo", param, configs[param], policy))
    evaluation = configs.get("evaluate_overrides") or (configs.get("overrides") if pipeline.startswith(
        "klear-evaluate") else None)
    if evaluation is not None:
        sampling = evaluation.sampling_for(1)
        positions = checks.model_positions(policy, sampling.engine_kwargs.get("hf_overrides"))
        found.append(checks.context_check("evaluate", "evaluate_overrides engine", sampling.max_model_len or positions,
                                          "sampling.max_model_len" if sampling.max_model_len else
                                          f"{policy.name}'s positions", PROMPT_BUDGET_TOKENS, sampling.max_tokens,
                                          "sampling.max_tokens", positions, policy.name))

    counts = nodes or sorted(set(DEFAULT_NODES) | ({params["rl_nodes"]} if isinstance(params.get("rl_nodes"), int)
                                                   else set()))
    for param in ("gppo_math_overrides", "gppo_code_overrides", "overrides"):
        if isinstance(configs.get(param), checks.GppoConfig):
            layout = checks.gppo_layout("gppo", param, configs[param], counts, cluster.gpus_per_node)
            if not nodes and params.get("rl_nodes") in counts:  # name the pipeline's own node count
                layout = [Check(c.stage, c.check.replace(f" at {params['rl_nodes']} x", f" at rl_nodes={params['rl_nodes']} x"),
                                c.ok, c.detail) for c in layout]
            found.extend(layout)

    estimates = {
        "cluster": {"name": cluster.name, "gpus_per_node": cluster.gpus_per_node,
                    "gpu_memory_gib": cluster.gpu_memory_gib},
        "nodes": counts,
        "prompt_budget_tokens": PROMPT_BUDGET_TOKENS,
        "parameters_billions": {m.name: round(checks.parameter_count(m) / 1e9, 2)
                                for m in (teacher, reference, policy)},
    }
    return found, estimates


def render_text(found: list[Check], estimates: Mapping[str, Any]) -> str:
    """An aligned table: stage, check, ok / FAIL, detail; then the estimates."""
    rows = [("STAGE", "CHECK", "OK", "DETAIL")] + [(c.stage, c.check, "ok" if c.ok else "FAIL", c.detail)
                                                   for c in found]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3] for row in rows]
    failed = sum(not c.ok for c in found)
    lines.append(f"\n{len(found) - failed} of {len(found)} checks pass" + (f"; {failed} FAIL" if failed else ""))
    lines += [f"{key}: {json.dumps(value)}" for key, value in estimates.items()]
    return "\n".join(lines) + "\n"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="check a pipeline's arguments against the cluster, before any GPU",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", help="compiled pipeline file, or a name under pipelines/compiled/")
    parser.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                        help="a pipeline argument (YAML/JSON value), as python -m pipelines.run_local takes it")
    parser.add_argument("--cluster", default="h100-80gb-x8",
                        help=f"a shipped node shape ({', '.join(shapes.shipped('cluster'))}) or a YAML file")
    parser.add_argument("--values", type=Path, default=None,
                        help=f"the chart values the teacher server runs with (default: {CHART_VALUES} if here)")
    parser.add_argument("--nodes", default="", help="node counts for the training layouts, e.g. 1,2,4,8 "
                        f"(default: {','.join(map(str, DEFAULT_NODES))} and the pipeline's rl_nodes)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(func=_main)


def _nodes(text: str) -> list[int] | None:
    if not text:
        return None
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--nodes {text!r}: expected node counts such as 1,2,4,8") from None
    if any(count < 1 for count in counts):
        raise ValueError(f"--nodes {text!r}: node counts start at 1")
    return counts


def _main(args: argparse.Namespace) -> int:
    name, defaults = pipeline_parameters(pipeline_file(args.pipeline))
    params = apply_arguments(defaults, args.arg)
    values = args.values if args.values is not None else (CHART_VALUES if CHART_VALUES.is_file() else None)
    if values is not None and not values.is_file():
        raise ValueError(f"--values {values}: no such file")
    found, estimates = plan(name, params, shapes.cluster(args.cluster), values, _nodes(args.nodes))
    if args.format == "json":
        print(json.dumps({"pipeline": name, "checks": [c.to_json() for c in found], "estimates": estimates}, indent=2))
    else:
        print(render_text(found, estimates), end="")
    return 0 if all(c.ok for c in found) else 1
