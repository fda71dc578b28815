"""`klear plan PIPELINE`: check a compiled pipeline's arguments against the cluster and models it will run on.

    klear plan klear-reasoner --cluster h100-80gb-x8 --arg gppo_code_overrides='["eps_high=0.3"]' --format json

PIPELINE is a compiled pipeline file, or a name looked up as pipelines/compiled/<name>.yaml under the current
folder. Its parameters' defaults come from the compiled spec; `--arg NAME=VALUE` (a YAML/JSON value, as
`python -m pipelines.run_local` takes it) overrides one. Exit 0 when every check passes, 1 when one fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from klear.cli import STAGES
from klear.common import kfp_io
from klear.common.config import StageConfig, load_config, origins_lines
from klear.evaluate.config import EvaluateConfig
from klear.gppo.config import GppoConfig
from klear.judge.config import JudgeConfig
from klear.plan import checks, estimates, memory, pods, shapes
from klear.plan.checks import PROMPT_BUDGET_TOKENS, Check
from klear.sample.config import SampleConfig
from klear.sft.config import SftConfig

COMPILED = Path("pipelines") / "compiled"
CHART_VALUES = Path("charts") / "klear-reasoner" / "values.yaml"  # the chart's own, where the checkout has it
DEFAULT_NODES = (1, 2, 4, 8)
# The paper's models, by role (shapes/<name>.yaml): the teacher behind the chart's server, the reference model,
# and the base model whose SFT and RL policies keep its config.json.
TEACHER, REFERENCE, POLICY = "deepseek-r1-0528", "qwen3-8b", "qwen3-8b-base"

# Single-stage pipelines whose model is, in the recipe, a policy SFT trained (the paper preset's positions), where its
# config.json cannot be read here.
TRAINED_POLICY_PIPELINES = ("klear-gppo-math", "klear-gppo-code", "klear-evaluate")
CONFIGS = {stage: f"klear.{stage.replace('-', '_')}.config" for stage in STAGES}
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
    """The stage's config: the StageConfig of klear.<package>.config whose presets are the package's own."""
    module = importlib.import_module(CONFIGS[stage])
    package = module.__name__.rpartition(".")[0]
    found = [value for value in vars(module).values() if isinstance(value, type) and issubclass(value, StageConfig)
             and value.__module__ == module.__name__ and getattr(value, "preset_package", None) == package]
    if len(found) != 1:
        raise LookupError(f"{module.__name__}: {len(found)} StageConfig classes with preset_package = {package!r}, "
                          "not one (the stage's config)")
    return found[0]


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


def compiled_documents(path: Path) -> list[Any]:
    """The compiled file's YAML documents: the pipeline spec, then the platform spec where there is one."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the ~500 KB recipe spec in a fraction of a second
    try:
        return list(yaml.load_all(path.read_text(), Loader=loader)) or [None]
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not a compiled pipeline: {exc}") from None


def pipeline_parameters(path: Path, documents: list[Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The pipeline's name and its parameters' defaults (root.inputDefinitions.parameters.<name>.defaultValue;
    None where a parameter has none)."""
    spec: Any = (documents or compiled_documents(path))[0]
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


# --------------------------------------------------------------------------- the run's own models and layout

# The pipeline parameter naming each role's model, by the context checks that read that model's shape.
MODEL_PARAMETERS = {"teacher": ("teacher_model_uri",), "reference": ("reference_model_uri",),
                    "policy": ("base_model_uri", "model_uri")}
# Fields of config.json that tell the shipped model shapes apart (and a tiny test model from them).
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
                "intermediate_size", "max_position_embeddings")


def _role_of(check: Check) -> str:
    """The model role a context or memory check reads the shape of ("" for other checks)."""
    kind, _, use = check.check.partition(": ")
    if kind not in ("context", "memory"):
        return ""
    return "teacher" if use.startswith("teacher_") else "reference" if use.startswith("reference_") else "policy"


def shape_of(config: Mapping[str, Any]) -> str | None:
    """The shipped model shape a config.json is (its SHAPE_FIELDS all equal), or None."""
    for name in shapes.shipped("model"):
        shape = shapes.model(name)
        if all(config.get(field) == getattr(shape, field) for field in SHAPE_FIELDS):
            return name
    return None


def unshipped_models(params: Mapping[str, Any]) -> dict[str, str]:
    """Role -> why its model-shape checks do not apply, for each role whose model URI is given and whose
    config.json is readable and none of the shipped shapes (a tiny local model: the checks are written for the
    paper's models). A role without a URI, or whose config.json cannot be read here, is planned with the paper's
    model."""
    from klear.common import storage

    reasons = {}
    for role, names in MODEL_PARAMETERS.items():
        uri = next((params[n] for n in names if isinstance(params.get(n), str) and params[n]), "")
        if not uri:
            continue
        try:
            config = json.loads(storage.read_bytes(storage.Uri.parse(uri).join("config.json")))
        except (storage.StorageError, OSError, ValueError):  # unreachable here (no credentials, no network) or
            # not JSON: plan the paper's model
            continue
        if isinstance(config, dict) and shape_of(config) is None:
            reasons[role] = (f"model {uri}: its config.json is none of the shipped model shapes "
                             f"({', '.join(shapes.shipped('model'))}); model-shape checks apply to those only")
    return reasons


def _unless_unshipped(check: Check, unshipped: Mapping[str, str]) -> Check:
    role = _role_of(check)
    return checks.unchecked_model(check.stage, check.check, role, unshipped[role]) if role in unshipped else check


def own_layout(params: Mapping[str, Any], prefix: str) -> tuple[list[int], int] | None:
    """The run's own training layout from <prefix>nodes and <prefix>gpus_per_node: ([nodes], processes per node;
    "0" GPUs is one process on CPU, as klear.training.launch runs it); None without those parameters."""
    nodes, gpus = params.get(f"{prefix}nodes"), params.get(f"{prefix}gpus_per_node")
    if not isinstance(nodes, int) or gpus is None:
        return None
    try:
        count = int(str(gpus).strip())
    except ValueError:
        return None
    return [nodes], max(count, 1)


# --------------------------------------------------------------------------- GPUs at once

# The pipeline parameter sizing each klear-reasoner use's pods (pods.recipe_pods), for the per-pod checks.
POD_PARAMETERS = {"teacher": "teacher_gpus", "reference": "reference_gpus", "filter-math": "filter_gpus",
                  "eval-base": "eval_gpus", "sft": "sft_gpus_per_node", "math-rl": "rl_gpus_per_node"}
# Uses whose engine loads a model of one of the shipped shapes, by the role whose shape it is and the parameter
# that, when set, makes the use a model rather than an endpoint ("" : always a model).
MODEL_USES = (("reference", "reference", "reference_gpus", ""), ("eval-base", "policy", "eval_gpus", ""),
              ("teacher", "teacher", "teacher_gpus", "teacher_model_uri"),
              ("filter-math", "teacher", "filter_gpus", "filter_model_uri"))


def stage_pods(params: Mapping[str, Any]) -> tuple[str, pods.Pods] | None:
    """A single-stage pipeline's pods: (the GPU parameter, its pods), sampling slices or training nodes."""
    if "slices" in params and "gpus" in params:
        return "gpus", pods.Pods("slices", int(params["slices"]), pods.gpu_count(params["gpus"]))
    if "nodes" in params and "gpus_per_node" in params:
        return "gpus_per_node", pods.Pods("nodes", int(params["nodes"]), pods.gpu_count(params["gpus_per_node"]))
    return None


def pod_checks(params: Mapping[str, Any], cluster: shapes.Cluster, quota: int,
               unshipped: Mapping[str, str]) -> list[Check]:
    """Each pod on one node, a paper-shaped model on a GPU, and the GPUs each phase wants at once against `quota`
    (0: the cluster's nodes x GPUs per node; neither: not checked)."""
    quota = quota or cluster.nodes * cluster.gpus_per_node
    try:
        if "teacher_slices" in params:
            uses = pods.recipe_pods(params)
            phases: Any = pods.RECIPE_PHASES
            sized = [(param, uses[use]) for use, param in POD_PARAMETERS.items()]
        elif (single := stage_pods(params)) is not None:
            uses, phases, sized = {"stage": single[1]}, (("the stage", ("stage",)),), [single]
        else:
            return []
    except (KeyError, ValueError) as exc:
        return [Check("pipeline", "pods", False, f"the run's pod sizes: {exc}")]
    found = [pods.pod_fits_node("pipeline", param, use, cluster.gpus_per_node) for param, use in sized]
    if "teacher_slices" in params:
        for use, role, param, when in MODEL_USES:
            if (not when or params.get(when)) and role not in unshipped:
                model = {"teacher": TEACHER, "reference": REFERENCE, "policy": POLICY}[role]
                found.append(pods.model_needs_gpu("sample", param, use, uses[use].gpus, model))
    if not quota:
        found.append(Check("pipeline", "pods: GPUs at once", True,
                           f"not checked: cluster {cluster.name} states no nodes and no quota was given"))
        return found
    return found + pods.phase_checks(uses, phases, quota)


# --------------------------------------------------------------------------- disk

# klear-reasoner's sampling uses whose merges stage rows of paper size: (overrides parameter, the slices parameter,
# prompts it samples from the assumptions, response fraction of max_tokens, the overrides parameter of the stage
# whose judge settings a judge merge of its rows uses, "" where none judges them).
def _merged_uses(assumed: estimates.Assumptions) -> tuple[tuple[str, str, int, float, str], ...]:
    return (("teacher_overrides", "teacher_slices", assumed.sft_prompts, assumed.teacher_response_fraction, ""),
            ("reference_overrides", "reference_slices", assumed.sft_prompts, assumed.reference_response_fraction,
             "sft_data_overrides"),
            ("filter_math_overrides", "filter_math_slices", round(assumed.rl_math_problems / assumed.math_filter_keep),
             assumed.filter_response_fraction, "rl_filter_math_overrides"),
            ("filter_code_overrides", "filter_code_slices", round(assumed.rl_code_problems / assumed.code_filter_keep),
             assumed.filter_response_fraction, "rl_filter_code_overrides"))


def disk_checks(configs: Mapping[str, Any], params: Mapping[str, Any], assumed: estimates.Assumptions,
                unshipped: Mapping[str, str]) -> list[Check]:
    """Each merge's staging against the merges' scratch volume, at the assumed prompt counts and response lengths
    (tokens x TEXT_BYTES_PER_TOKEN per row): a sample merge's parts and spill (pods.merge_staging_bytes), a judge
    merge's input part and two of its parts (pods.judge_merge_bytes); and a model folder a slice pod downloads
    against its scratch (the teacher or filter model given as a folder rather than served)."""
    found = []
    for param, slices_param, prompts, fraction, judged_by in _merged_uses(assumed):
        config = configs.get(param)
        if config is None or config.backend == "records" and param != "teacher_overrides":
            continue
        rows = (min(prompts, config.max_prompts) if config.max_prompts else prompts) * config.n
        per_row = pods.TEXT_BYTES_PER_TOKEN * (assumed.prompt_tokens + fraction * config.max_tokens)
        assumed_rows = (f"{rows:,} rows of ~{per_row / 1024:,.0f} KiB (assumed {prompts:,} prompts, responses "
                        f"{fraction:g} x max_tokens {config.max_tokens})")
        given = params.get(slices_param)
        slices = given if isinstance(given, int) and given > 0 else 1
        found.append(pods.scratch_check(
            "sample", f"{param} merge",
            pods.merge_staging_bytes(rows, per_row, config.rows_per_part, slices, config.shard_size),
            kfp_io.MERGE_SCRATCH, f"{assumed_rows}: at most 2 parts of rows_per_part {config.rows_per_part:,} + "
            f"{slices} slices x shard_size {config.shard_size} spilled, each part uploaded as it closes"))
        if judged_by:
            # The judge settings of the stage that reads the judged rows (the pipeline's judge step takes them).
            shard = getattr(configs.get(judged_by), "judge", JudgeConfig()).rows_per_shard
            found.append(pods.scratch_check(
                "judge", f"{param} judge merge",
                pods.judge_merge_bytes(rows, per_row, shard, config.rows_per_part), kfp_io.MERGE_SCRATCH,
                f"{assumed_rows}, judged: 1 samples part of rows_per_part {config.rows_per_part:,} read at a time + "
                f"at most 2 parts of {judged_by} judge.rows_per_shard {shard:,}, each uploaded as it closes"))
    teacher = shapes.model(TEACHER)
    for uri_param in ("teacher_model_uri", "filter_model_uri"):
        if params.get(uri_param) and "teacher" not in unshipped:
            size = checks.parameter_count(teacher) * memory.DTYPE_BYTES.get(
                teacher.checkpoint_dtype or teacher.torch_dtype, 1)
            found.append(pods.scratch_check(
                "sample", f"{uri_param} download", size, kfp_io.ENDPOINT_SLICE_SCRATCH,
                f"{uri_param}: {teacher.name}'s folder ({teacher.checkpoint_dtype or teacher.torch_dtype}) in each "
                f"slice pod; serve it (the chart's teacher server, an endpoint) rather than download it per slice"))
    return found


# --------------------------------------------------------------------------- the plan


def plan(pipeline: str, params: Mapping[str, Any], cluster: shapes.Cluster, values_file: Path | None,
         nodes: list[int] | None, workflow: Mapping[str, int] | None = None,
         run_layout: bool = False, gpu_quota: int = 0,
         assumed: estimates.Assumptions | None = None) -> tuple[list[Check], dict[str, Any]]:
    """Every check of the pipeline's arguments on `cluster`, and the estimates beside them. `workflow`: the compiled
    spec's Workflow size estimate (checks.workflow_size), checked and recorded where given. `run_layout`: the
    training layouts at the run's own nodes and GPUs per node (the pipeline's plan task) instead of the cluster's
    GPUs at every node count. `gpu_quota`: the GPUs the run may hold at once (0: the cluster's nodes x GPUs).
    `assumed`: the data sizes and rates the disk checks and the GPU-hour estimates assume (estimates.Assumptions)."""
    assumed = assumed or estimates.Assumptions()
    found: list[Check] = []
    configs: dict[str, Any] = {}
    resolved: dict[str, Any] = {}
    for stage, preset_param, overrides_param in settings_uses(pipeline, params):
        check, config, origins = checks.settings_check(stage, config_class(stage), preset_param,
                                                       params[preset_param], overrides_param, params[overrides_param])
        found.append(check)
        configs[overrides_param] = config
        if config is not None:
            resolved[overrides_param] = {"stage": stage, "config": config, "origins": origins}

    teacher, reference, policy = shapes.model(TEACHER), shapes.model(REFERENCE), shapes.model(POLICY)
    unshipped = unshipped_models(params)
    sft = configs.get("sft_overrides")
    if sft is None and pipeline in TRAINED_POLICY_PIPELINES:  # their model is the recipe's SFT (or RL) output
        sft = load_config(SftConfig, "paper")
    if sft is not None and sft.max_position_embeddings:  # the trained policy declares what SFT set
        policy = dataclasses.replace(policy, name=f"{policy.name} after sft",
                                     max_position_embeddings=sft.max_position_embeddings)
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
        if isinstance(configs.get(param), GppoConfig):
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
        if isinstance(configs.get(param), GppoConfig):
            own = own_layout(params, "rl_" if "rl_nodes" in params else "") if run_layout else None
            layout = checks.gppo_layout("gppo", param, configs[param], *(own or (counts, cluster.gpus_per_node)))
            if not nodes and params.get("rl_nodes") in counts:  # name the pipeline's own node count
                layout = [Check(c.stage, c.check.replace(f" at {params['rl_nodes']} x", f" at rl_nodes={params['rl_nodes']} x"),
                                c.ok, c.detail) for c in layout]
            found.extend(layout)
    for param in ("sft_overrides", "overrides"):
        if isinstance(configs.get(param), SftConfig):
            sft_counts = nodes or sorted(set(DEFAULT_NODES) | ({params["sft_nodes"]} if isinstance(
                params.get("sft_nodes"), int) else set()))
            own = own_layout(params, "sft_" if "sft_nodes" in params else "") if run_layout else None
            found.extend(checks.sft_layout("sft", param, configs[param], *(own or (sft_counts, cluster.gpus_per_node))))

    found.extend(pod_checks(params, cluster, gpu_quota, unshipped))
    found.extend(disk_checks(configs, params, assumed, unshipped))
    if workflow is not None:
        found.append(checks.workflow_check(workflow))
    found_estimates = {
        "cluster": {"name": cluster.name, "gpus_per_node": cluster.gpus_per_node,
                    "gpu_memory_gib": cluster.gpu_memory_gib},
        "nodes": counts,
        "prompt_budget_tokens": PROMPT_BUDGET_TOKENS,
        "parameters_billions": {m.name: round(checks.parameter_count(m) / 1e9, 2)
                                for m in (teacher, reference, policy)},
        **({"workflow": dict(workflow)} if workflow is not None else {}),
    }
    # GPU memory per process (klear/plan/memory.py): SFT, the GPPO actor and its vLLM, the sampling engines
    memory_found, found_estimates["memory_per_gpu"] = memory.memory_checks(
        configs, params, cluster, counts, policy, reference, checks.parameter_count(policy),
        checks.parameter_count(reference))
    found.extend(memory_found)
    found_estimates["gpu_hours"] = gpu_hours(pipeline, configs, params, cluster, policy, reference, teacher, assumed)
    found_estimates["configurations"] = resolved  # rendered by render_text / configurations_json
    return [_unless_unshipped(check, unshipped) for check in found], found_estimates


def gpu_hours(pipeline: str, configs: Mapping[str, Any], params: Mapping[str, Any], cluster: shapes.Cluster,
              policy: shapes.Model, reference: shapes.Model, teacher: shapes.Model,
              assumed: estimates.Assumptions) -> dict[str, Any]:
    """Tokens and GPU-hours per stage (klear.plan.estimates) of the configs the pipeline loads: the recipe's by
    overrides parameter, a single-stage pipeline's by its config's type; {"not estimated": why} on a cluster
    without throughput figures."""
    single = configs.get("overrides")
    sampling = single if isinstance(single, SampleConfig) else None
    gppo = single if isinstance(single, GppoConfig) else None
    try:
        return estimates.estimate(
            policy=policy, reference_model=reference, teacher_model=teacher, cluster=cluster,
            teacher=configs.get("teacher_overrides") or sampling, reference=configs.get("reference_overrides"),
            filter_math=configs.get("filter_math_overrides"), filter_code=configs.get("filter_code_overrides"),
            sft=configs.get("sft_overrides") or (single if isinstance(single, SftConfig) else None),
            gppo_math=configs.get("gppo_math_overrides") or (gppo if pipeline.endswith("-math") else None),
            gppo_code=configs.get("gppo_code_overrides") or (gppo if pipeline.endswith("-code") else None),
            evaluation=configs.get("evaluate_overrides") or (single if isinstance(single, EvaluateConfig) else None),
            evaluated_models=("base", "sft", "rl") if "evaluate_overrides" in configs else ("model",),
            evaluate_code=bool(params.get("evaluate_code")), assumptions=assumed)
    except ValueError as exc:
        return {"not estimated": str(exc)}


class PlanFailed(RuntimeError):
    """A run's plan has failed checks: raised by the pipeline's plan task, failing the run before any stage."""


def run_plan(pipeline: str, params: Mapping[str, Any], cluster: str, gpu_quota: int = 0) -> str:
    """The plan of a run from its arguments (no compiled file, no chart values), its training layouts at the run's
    own nodes and GPUs: the table, or PlanFailed naming every failed check's stage, check and detail."""
    found, figures = plan(pipeline, params, shapes.cluster(cluster), None, None, run_layout=True,
                          gpu_quota=gpu_quota)
    table = render_text(found, figures)
    print(table, end="", flush=True)
    failed = [c for c in found if not c.ok]
    if failed:
        raise PlanFailed(f"{pipeline}: {len(failed)} plan check(s) failed, before any stage ran:\n" + "\n".join(
            f"  {c.stage}: {c.check}: {c.detail}" for c in failed))
    return table


def configurations_json(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """Each loaded config by its overrides parameter: stage, values (as JSON) and where each came from."""
    return {param: {"stage": entry["stage"], "values": entry["config"].model_dump(mode="json"),
                    "origins": entry["origins"]} for param, entry in resolved.items()}


def render_configurations(resolved: Mapping[str, Any]) -> str:
    """Every resolved config, key = value (where it came from), a block per overrides parameter."""
    blocks = []
    for param, entry in resolved.items():
        lines = origins_lines(entry["config"], entry["origins"])
        blocks.append(f"== {entry['stage']}: {param} ({type(entry['config']).__name__})\n"
                      + "\n".join(f"   {line}" for line in lines))
    return "\n".join(blocks) + "\n\n" if blocks else ""


def render_text(found: list[Check], figures: Mapping[str, Any]) -> str:
    """Every resolved config with its values' origins; an aligned table: stage, check, ok / FAIL, detail; the
    tokens and GPU-hours per stage; then the other estimates."""
    figures = dict(figures)
    configurations = render_configurations(figures.pop("configurations", {}))
    hours = figures.pop("gpu_hours", {})
    rows = [("STAGE", "CHECK", "OK", "DETAIL")] + [(c.stage, c.check, "ok" if c.ok else "FAIL", c.detail)
                                                   for c in found]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3] for row in rows]
    failed = sum(not c.ok for c in found)
    lines.append(f"\n{len(found) - failed} of {len(found)} checks pass" + (f"; {failed} FAIL" if failed else ""))
    if hours.get("rows"):
        lines.append("\n" + estimates.render_estimates(hours).rstrip("\n") + "\n")
    elif hours:
        lines.append(f"\ngpu_hours: {json.dumps(hours)}")
    lines += [f"{key}: {json.dumps(value)}" for key, value in figures.items()]
    return configurations + "\n".join(lines) + "\n"


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
    parser.add_argument("--gpu-quota", type=int, default=0, metavar="GPUS",
                        help="the GPUs the run may hold at once (default: the cluster shape's nodes x GPUs per node)")
    parser.add_argument("--prompts", type=int, default=0, metavar="N",
                        help="curated prompts the teacher and reference sample, for the disk checks and GPU-hour "
                        f"estimates (default: assumed {estimates.Assumptions().sft_prompts:,})")
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
    path = pipeline_file(args.pipeline)
    documents = compiled_documents(path)
    name, defaults = pipeline_parameters(path, documents)
    params = apply_arguments(defaults, args.arg)
    values = args.values if args.values is not None else (CHART_VALUES if CHART_VALUES.is_file() else None)
    if values is not None and not values.is_file():
        raise ValueError(f"--values {values}: no such file")
    workflow = checks.workflow_size(documents[0], documents[1] if len(documents) > 1 else None)
    if args.gpu_quota < 0 or args.prompts < 0:
        raise ValueError(f"--gpu-quota {args.gpu_quota} / --prompts {args.prompts}: counts are 0 or more")
    assumed = dataclasses.replace(estimates.Assumptions(), sft_prompts=args.prompts) if args.prompts else None
    found, figures = plan(name, params, shapes.cluster(args.cluster), values, _nodes(args.nodes),
                          workflow=workflow, gpu_quota=args.gpu_quota or int(params.get("plan_gpu_quota") or 0),
                          assumed=assumed)
    if args.format == "json":
        configurations = configurations_json(figures.pop("configurations", {}))
        print(json.dumps({"pipeline": name, "checks": [c.to_json() for c in found], "estimates": figures,
                          "configurations": configurations}, indent=2))
    else:
        print(render_text(found, figures), end="")
    return 0 if all(c.ok for c in found) else 1
