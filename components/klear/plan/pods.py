"""What a run asks of the cluster at once, for `klear plan`: GPUs per phase against the quota, and each disk-staging
task's scratch against the volume the pipeline gives it. Small pure functions of the run's arguments.

The phases follow klear-reasoner's DAG (pipelines/definitions.py): the teacher and the reference model sample
first (the teacher is the critical path: SFT waits for it); the filter model and the base model's evaluation wait
for the teacher's merge; SFT waits for the reference model's judged samples; math RL for SFT and the math filter,
code RL for math RL; each model's evaluation for that model. Within a phase every pod that the DAG lets run at once
is counted: KFP 2.17 bounds a ParallelFor only at compile time, so every slice pod of a use is created at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from klear.plan.checks import Check


@dataclass(frozen=True)
class Pods:
    """`count` pods of `gpus` GPUs each, of one use (a sampling use's slices, or a training job's nodes)."""

    use: str
    count: int
    gpus: int

    @property
    def total(self) -> int:
        return self.count * self.gpus

    def describe(self) -> str:
        return f"{self.use} {self.count} x {self.gpus}"


def gpu_count(value: Any) -> int:
    """A pod's GPUs from a pipeline parameter ("8", 8, "0"); a value that is no whole number is refused by name."""
    text = str(value).strip()
    if not text.isdigit():
        raise ValueError(f"not a whole number of GPUs: {value!r}")
    return int(text)


# Which uses may hold GPUs at the same time, at worst, in klear-reasoner (module docstring).
RECIPE_PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("1 teacher + reference", ("teacher", "reference")),
    ("2 reference + filter + eval-base", ("reference", "filter-math", "filter-code", "eval-base")),
    ("3 SFT + filter + eval-base", ("sft", "filter-math", "filter-code", "eval-base")),
    ("4 math RL + filter-code + eval-sft", ("math-rl", "filter-code", "eval-sft")),
    ("5 code RL + eval-sft", ("code-rl", "eval-sft")),
    ("6 eval-rl + eval-sft", ("eval-rl", "eval-sft")),
)


def recipe_pods(params: Mapping[str, Any]) -> dict[str, Pods]:
    """Each use's pods from klear-reasoner's arguments: slices x GPUs per slice pod (evaluation: per benchmark kind,
    math, and code where evaluate_code is set), nodes x GPUs per node of each training job."""
    kinds = 2 if params.get("evaluate_code") else 1

    def training(prefix: str, use: str) -> Pods:
        return Pods(use, int(params[f"{prefix}_nodes"]), gpu_count(params[f"{prefix}_gpus_per_node"]))

    uses = {
        "teacher": Pods("teacher slices", int(params["teacher_slices"]), gpu_count(params["teacher_gpus"])),
        "reference": Pods("reference slices", int(params["reference_slices"]), gpu_count(params["reference_gpus"])),
        "filter-math": Pods("filter-math slices", int(params["filter_math_slices"]), gpu_count(params["filter_gpus"])),
        "filter-code": Pods("filter-code slices", int(params["filter_code_slices"]), gpu_count(params["filter_gpus"])),
        "sft": training("sft", "SFT nodes"),
        "math-rl": training("rl", "math RL nodes"),
        "code-rl": training("rl", "code RL nodes"),
    }
    for label in ("base", "sft", "rl"):
        uses[f"eval-{label}"] = Pods(f"eval-{label} slices", kinds * int(params["eval_slices"]),
                                     gpu_count(params["eval_gpus"]))
    return uses


def pod_fits_node(stage: str, param: str, pods: Pods, gpus_per_node: int) -> Check:
    """A pod runs on one node: its GPUs at most the node's (the scheduler never places a larger one)."""
    ok = pods.gpus <= gpus_per_node
    return Check(stage, f"pods: {param} per pod", ok,
                 f"{param} {pods.gpus} GPUs per pod {'<=' if ok else '>'} {gpus_per_node} GPUs per node"
                 + ("" if ok else ": the pod is never scheduled"))


def phase_checks(uses: Mapping[str, Pods], phases: Sequence[tuple[str, Sequence[str]]], quota: int) -> list[Check]:
    """GPUs wanted at once in each phase against `quota`. Over it, the pods beyond wait (a slice pod or a training
    job's worker Pending): a run whose critical path waits behind its own side work, or a multi-node job
    part-scheduled beside slices that hold the rest, which waits until they end."""
    found = []
    for phase, names in phases:
        present = [uses[name] for name in names if uses[name].total]
        wanted = sum(p.total for p in present)
        ok = wanted <= quota
        parts = " + ".join(p.describe() for p in present) or "no GPU pod"
        found.append(Check("pipeline", f"pods: phase {phase}", ok,
                           f"{wanted} GPUs at once ({parts}) {'<=' if ok else '>'} quota {quota}"
                           + ("" if ok else ": lower the slices or GPUs per pod of the uses named, or raise the "
                              "quota (plan_gpu_quota)")))
    return found


def model_needs_gpu(stage: str, param: str, use: str, gpus: int, model: str) -> Check:
    """A use that runs a model of one of the shipped (paper) shapes on vLLM needs a GPU; "0" GPUs would load it on
    the pod's CPU (the CPU build of the GPU image has none)."""
    ok = gpus > 0
    return Check(stage, f"pods: {use} model", ok,
                 f"{param} {gpus}: {model} " + ("runs on the pod's GPUs" if ok else
                                                "would run on CPU: give the use at least 1 GPU"))


# --------------------------------------------------------------------------- disk

GIB = 1024 ** 3


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes quantity with a binary suffix ("256Gi", "1Ti", "512Mi") in bytes."""
    units = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}
    for suffix, scale in units.items():
        if quantity.endswith(suffix) and quantity[:-2].isdigit():
            return int(quantity[:-2]) * scale
    raise ValueError(f"not a binary quantity such as 256Gi: {quantity!r}")


# Bytes of response text per token (an assumption): BPE vocabularies of Qwen's and DeepSeek's size average about 4
# characters of English and LaTeX per token; the spilled buckets hold it uncompressed (Arrow IPC), the Parquet output
# compressed (barely, for such text), so this per row bounds both.
TEXT_BYTES_PER_TOKEN = 4
# Rows a sample merge may read ahead of its output's frontier besides the slices' open shards (units retried out of
# order): klear.sample.coordinator.write_in_order's bound.
SPILL_SLACK_ROWS = 4096


def merge_staging_bytes(rows: int, bytes_per_row: float, rows_per_part: int, slices: int, shard_size: int) -> int:
    """What a sample merge holds on disk at once (klear.sample.coordinator.write_in_order): each Parquet part is uploaded
    as soon as it is closed, so at most two parts (the one being written, the one going up), plus the buckets it
    spills while reordering rows, about a shard per slice ahead of the frontier; never more than twice the output."""
    return int(min(2 * rows, 2 * rows_per_part + slices * shard_size + SPILL_SLACK_ROWS) * bytes_per_row)


def judge_merge_bytes(rows: int, bytes_per_row: float, rows_per_shard: int, rows_per_part: int) -> int:
    """What a judge merge holds on disk at once (klear.judge.stage.run): the part of its samples it reads (each
    published part, `rows_per_part` rows, is downloaded in its turn and deleted after) and at most two of its own
    parts of `rows_per_shard` judged rows (the one being written, the one going up: each is uploaded as soon as it
    closes); never more than its input and output whole."""
    return int((min(rows, rows_per_part) + min(rows, 2 * rows_per_shard)) * bytes_per_row)


def scratch_check(stage: str, task: str, need: int, scratch: str, what: str) -> Check:
    """A task's staging `need` (bytes) fits its scratch volume (the pipeline's generic ephemeral volume)."""
    have = quantity_bytes(scratch)
    ok = need <= have
    return Check(stage, f"disk: {task}", ok,
                 f"{what}: ~{need / GIB:,.0f} GiB {'<=' if ok else '>'} scratch volume {scratch}"
                 + ("" if ok else ": the task fails when its disk fills"))
