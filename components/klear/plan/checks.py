"""The checks of `klear plan`, each a small pure function of resolved settings and shapes, returning `Check`s.

Every check names the stage, and where it failed the pipeline parameter and the key, so that a person can fix the
run's arguments without reading code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from klear.common.config import ConfigError, StageConfig, config_origins
from klear.gppo.config import GppoConfig, accumulation_steps
from klear.plan.shapes import Model
from klear.sft.config import SftConfig
from klear.sft.config import accumulation_steps as sft_accumulation_steps

# The longest prompt a sampling use or RL sends, in tokens. curate keeps prompts of any length, so the plan assumes
# the RL prompt budget of the paper's released script (max_prompt_length=$((1024 * 4)), the gppo presets'
# max_prompt_length): the recipe trains on no longer prompt, and a competition problem is well under it.
PROMPT_BUDGET_TOKENS = 4096


@dataclass(frozen=True)
class Check:
    stage: str
    check: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- settings


def settings_check(stage: str, cls: type[StageConfig], preset_param: str, preset: Any, overrides_param: str,
                   overrides: Any) -> tuple[Check, StageConfig | None, dict[str, str]]:
    """Whether `preset` + `overrides` load as `cls` (klear.common.config.load_config: unknown keys, types, ranges,
    the config's own validators), named by the pipeline parameters that hold them. Returns the config if it loads,
    and where each of its values came from (klear.common.config.config_origins)."""
    where = f"{preset_param}={preset!r} + {overrides_param}={overrides!r}"
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        return Check(stage, "settings", False, f"{overrides_param}: expected a list of \"key=value\" strings, "
                     f"got {overrides!r}"), None, {}
    if not isinstance(preset, str):
        return (Check(stage, "settings", False, f"{preset_param}: expected a preset name or file, got {preset!r}"),
                None, {})
    try:
        config, origins = config_origins(cls, preset or None, overrides)
    except ConfigError as exc:
        return Check(stage, "settings", False, f"{overrides_param if overrides else preset_param}: {exc}"), None, {}
    return Check(stage, "settings", True, f"{where}: loads as {cls.__name__}"), config, origins


# --------------------------------------------------------------------------- context


def context_check(stage: str, use: str, length: int, length_from: str, prompt: int, max_tokens: int,
                  tokens_from: str, positions: int | None = None, model: str = "") -> Check:
    """A sequence of `prompt` + `max_tokens` tokens fits an engine or server of `length` tokens, and that length
    fits the model's positions. vLLM's OpenAI server refuses a request whose prompt tokens + max_tokens exceed
    max_model_len (vllm/entrypoints/openai/serving_engine.py, `_validate_input`: "This model's maximum context
    length is ..."); its engine refuses a max_model_len past the model's max_position_embeddings without rope
    scaling (vllm/config: "User-specified max_model_len ... is greater than the derived max_model_len")."""
    need = prompt + max_tokens
    problems = []
    if length < need:
        problems.append(f"{length_from} {length} < prompt {prompt} + {tokens_from} {max_tokens} = {need}")
    if positions is not None and length > positions:
        problems.append(f"{length_from} {length} > {model}'s max_position_embeddings {positions}")
    detail = "; ".join(problems) if problems else (
        f"{length_from} {length} >= prompt {prompt} + {tokens_from} {max_tokens} = {need}"
        + (f" and <= {model}'s positions {positions}" if positions is not None else ""))
    return Check(stage, f"context: {use}", not problems, detail)


def model_positions(model: Model, hf_overrides: Mapping[str, Any] | None = None) -> int:
    """The positions a vLLM engine derives for the model: config.json's max_position_embeddings, or the one an
    engine's hf_overrides sets (the evaluate paper-64k preset's YaRN)."""
    value = (hf_overrides or {}).get("max_position_embeddings")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else model.max_position_embeddings


def gppo_context(stage: str, param: str, config: GppoConfig, policy: Model) -> Check:
    """GPPO's colocated vLLM engine: TRL's vllm_max_model_length is GppoConfig.engine_length (prompt + completion,
    klear.gppo.trainer.grpo_arguments), which must fit the policy's positions."""
    return context_check(stage, f"{param} vLLM engine", config.engine_length, "engine length",
                         config.max_prompt_length, config.max_completion_length, "max_completion_length",
                         policy.max_position_embeddings, policy.name)


# --------------------------------------------------------------------------- layout


def gppo_layout(stage: str, param: str, config: GppoConfig, nodes: Sequence[int], gpus_per_node: int) -> list[Check]:
    """GPPO's batch arithmetic at each node count: klear.gppo.config.accumulation_steps, the rule the trainer
    applies (TRL's GRPOConfig: an update is per_device_train_batch_size x processes x gradient_accumulation_steps
    rollouts; a generation round's prompts split over the processes)."""
    def verdict(world: int) -> tuple[bool, str]:
        try:
            steps = accumulation_steps(config, world)
        except ValueError as exc:
            return False, f"{param}: per_device_batch_size: {exc}"
        return True, (f"{world} processes x per_device_batch_size {config.per_device_batch_size} x {steps} "
                      f"accumulation steps = {config.prompts_per_update * config.num_generations} rollouts per update")

    return at_each_node_count(stage, param, nodes, gpus_per_node, verdict)


def at_each_node_count(stage: str, param: str, nodes: Sequence[int], gpus_per_node: int,
                       verdict: Callable[[int], tuple[bool, str]]) -> list[Check]:
    """One layout check per node count: `verdict(processes)` gives (ok, detail)."""
    return [Check(stage, f"layout: {param} at {count} x {gpus_per_node} GPUs", *verdict(count * gpus_per_node))
            for count in nodes]


def unchecked_model(stage: str, check: str, role: str, reason: str) -> Check:
    """A model-shape check that cannot apply (the run's model is none of the shipped shapes): passed, and said."""
    return Check(stage, check, True, f"not checked: {role} {reason}")


# --------------------------------------------------------------------------- the Workflow

# etcd's default --max-request-bytes (1.5 MiB): the Kubernetes API refuses a larger object, the Argo Workflow a
# KFP run becomes included (kubeflow/pipelines#13738, #9837).
ETCD_REQUEST_LIMIT = 1_572_864
# Per task, the Argo DAG entries the v2 compiler writes besides the task spec: a driver and an executor step with
# their names, dependencies and argument references (an assumption, ~1 KiB; not measured on a backend).
ARGO_BYTES_PER_TASK = 1024
# kubeflow/pipelines#13738 (backend 2.15, Argo 3.7): the running Workflow held each task's resolved container
# block (component spec, container, platform config) 4 times.
RUNNING_COPIES = 4


def _json_bytes(value: Any) -> int:
    import json

    return len(json.dumps(value, separators=(",", ":")))


def workflow_size(spec: Mapping[str, Any], platform: Mapping[str, Any] | None = None) -> dict[str, int]:
    """An estimate, not a measurement, of the Argo Workflow a compiled KFP v2 pipeline becomes, in bytes of JSON.

    submitted: what the API server stores at run creation. Since kubeflow/pipelines#10979 the v2 Argo compiler
    keeps each distinct component spec, container spec and Kubernetes executor config once (hashed workflow
    arguments), while each task's own spec is embedded in its driver step (the duplication that still grows with
    the task count, kubeflow/pipelines#13422):
        sum over distinct components, executors and platform configs of their JSON
        + sum over tasks (sub-DAGs included) of (task spec JSON + ARGO_BYTES_PER_TASK).
    running: the object as the last task runs, when, as kubeflow/pipelines#13738 measured, every task's resolved
    block (task, component, container and platform config JSON) is held RUNNING_COPIES times.
    """
    platform = platform or {}
    components = spec.get("components", {})
    executors = spec.get("deploymentSpec", {}).get("executors", {})
    configs = platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})
    tasks = dict(spec.get("root", {}).get("dag", {}).get("tasks", {}))
    for component in components.values():
        tasks |= component.get("dag", {}).get("tasks", {})
    shared = sum(_json_bytes(part) for group in (components, executors, configs) for part in group.values())
    submitted = shared + sum(_json_bytes(task) + ARGO_BYTES_PER_TASK for task in tasks.values())
    resolved = 0
    for task in tasks.values():
        component = components.get(task.get("componentRef", {}).get("name", ""), {})
        label = component.get("executorLabel", "")
        resolved += sum(_json_bytes(part) for part in (task, component, executors.get(label, {}),
                                                       configs.get(label, {})))
    return {"tasks": len(tasks), "submitted_bytes": submitted,
            "running_bytes": shared + RUNNING_COPIES * resolved + ARGO_BYTES_PER_TASK * len(tasks),
            "limit_bytes": ETCD_REQUEST_LIMIT}


def workflow_check(size: Mapping[str, int]) -> Check:
    """The run is created only if its Workflow fits etcd's request limit (the submitted estimate); the running
    estimate is stated beside it, a risk for status updates and retries (kubeflow/pipelines#13738)."""
    submitted, running, limit = size["submitted_bytes"], size["running_bytes"], size["limit_bytes"]
    detail = (f"estimated Argo Workflow {submitted / 2**20:.2f} MiB at submission ({size['tasks']} tasks), "
              f"{submitted / limit:.0%} of etcd's {limit / 2**20:.1f} MiB request limit; "
              f"~{running / 2**20:.2f} MiB while running if every task's spec is held {RUNNING_COPIES} times "
              f"(kubeflow/pipelines#13738)" + (": over the limit" if running > limit else ""))
    return Check("pipeline", "workflow: Argo object size", submitted <= limit, detail)


def sft_layout(stage: str, param: str, config: SftConfig, nodes: Sequence[int], gpus_per_node: int) -> list[Check]:
    """SFT's batch at each node count: klear.sft.config.accumulation_steps, the rule the trainer applies (Hugging
    Face Trainer: an optimizer step is per_device_train_batch_size x processes x gradient_accumulation_steps rows).
    Without a global batch, the batch grows with the node count, and the results with it."""
    def verdict(world: int) -> tuple[bool, str]:
        if not config.global_batch_size:  # a choice (the CPU presets make it), said: another node count, another batch
            return True, (f"{param}: global_batch_size 0: per_device_batch_size x gradient_accumulation_steps x "
                          f"processes = {config.per_device_batch_size * config.gradient_accumulation_steps * world} "
                          "rows per optimizer step here, another at another node count")
        try:
            steps = sft_accumulation_steps(config, world)
        except ValueError as exc:
            return False, f"{param}: {exc}"
        return True, (f"{world} processes x per_device_batch_size {config.per_device_batch_size} x {steps} "
                      f"accumulation steps = global_batch_size {config.global_batch_size} rows")

    return at_each_node_count(stage, param, nodes, gpus_per_node, verdict)


# --------------------------------------------------------------------------- estimates


def parameter_count(model: Model) -> int:
    """Weights of a decoder from its config.json: embeddings (and an untied output head), attention (GQA, or
    DeepSeek's MLA from its LoRA ranks and head dims: DeepSeek-V3 technical report §2.1.1), the MLP (SwiGLU: 3
    matrices; MoE layers after `first_k_dense_replace`: routed and shared experts plus the router). Norms omitted
    (under 0.01 %); DeepSeek's multi-token-prediction layer too (not used for sampling)."""
    h, heads = model.hidden_size, model.num_attention_heads
    embeddings = model.vocab_size * h * (1 if model.tie_word_embeddings else 2)
    if model.kv_lora_rank:
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        attention = (h * model.q_lora_rank + model.q_lora_rank * heads * qk
                     + h * (model.kv_lora_rank + model.qk_rope_head_dim)
                     + model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim)
                     + heads * model.v_head_dim * h)
    else:
        attention = 2 * h * heads * model.head_dim + 2 * h * model.num_key_value_heads * model.head_dim
    dense = 3 * h * model.intermediate_size
    moe = (model.n_routed_experts + model.n_shared_experts) * 3 * h * model.moe_intermediate_size \
        + h * model.n_routed_experts
    dense_layers = model.first_k_dense_replace if model.n_routed_experts else model.num_hidden_layers
    layers = model.num_hidden_layers * attention + dense_layers * dense \
        + (model.num_hidden_layers - dense_layers) * moe
    return embeddings + layers
