"""`klear plan`'s memory formulas (klear/plan/memory.py) against a measurement: SFT and the GPPO actor on CPU.

    python benchmarks/bench_plan_memory.py [--repeat 3] [--settings NAME ...]

A Qwen3 model of 8 layers, hidden 512 (klear.demo.tiny_model with a wider TinySpec: 25.6M parameters, so that model
states and activations come to ~1.5 GiB in fp32 and the formulas' terms, not allocator noise, make the figure) is
saved once; each setting then runs in a fresh process:

  sft    the project's SFT trainer (klear.sft.stage training_arguments + make_trainer: TRL's SFTTrainer with
         best-fit-decreasing packing, padding-free, sdpa, fp32, no DeepSpeed: the tiny preset) for STEPS optimizer
         steps of 2 micro-steps each, on rows of 2 x 1024 tokens packed from synthetic documents of 256 tokens;
  gppo   the project's GPPO trainer (klear.gppo.stage.make_trainer: GppoTrainer, its _compute_loss the policy loss of
         klear.gppo.losses plus the SFT term, over TRL's fused LM head) for STEPS optimizer steps of 2 micro-steps of
         4 rollouts of 128 + 384 tokens, through its real training loop. Only the rollouts are made up:
         _generate_and_score_completions returns them (prompts left-padded, completions right-padded, the longest at
         the full width, as a generation round's batch is) with random advantages; an update does not depend on how
         its tokens were sampled.
Each with and without gradient checkpointing. Two micro-steps per optimizer step, so that the second runs beside the
first's gradients (a run's accumulation steps do: the paper's layouts accumulate 8), and two optimizer steps, so that
the second runs beside Adam's moments: the plan's model states count weights, gradients and moments at once.

What is measured, and why. The plan's figure is what a GPU's caching allocator must hand out (torch.cuda's
max_memory_allocated); the CUDA context, NCCL and fragmentation are left to its MARGIN. The CPU analog is the peak of
live tensor bytes: torch.profiler with profile_memory=True reports every allocation and free of PyTorch's CPU
allocator (signed sizes, time-stamped), so their running sum over trainer.train() is the live tensor bytes less those
held when it began: the model's weights (the trainer loads them), counted apart and added. Nothing else of the
process is in it, as nothing else is in the plan's figure. The process's resident memory is printed beside it (VmHWM
after training less VmRSS before the model: it adds the interpreter's objects, the libraries' pages touched, glibc's
arenas), for the record; glibc runs with a fixed mmap threshold (MALLOC_MMAP_THRESHOLD_) so that freed tensors leave
the resident set rather than linger in its heap. Per part: the model states counted exactly (weights, gradients and
Adam's states after the run), and without checkpointing the storages autograd saves in the model's forward (a
saved-tensors hook, largest pass), the L x L ones (attention masks) apart.

Terms of the CPU path that a GPU's does not have, in the measured peak: TRL's fused LM head folds each tile in torch
ops where a GPU runs a Triton kernel (a few more tile-sized temporaries, of tokens x vocabulary, small here), and
scores every position (its `compact` indexing is for Triton devices only), so GPPO's head tile here is
prompt + completion tokens tall (2,044 rows, 0.25 GiB) where the plan counts a GPU's completion tokens (1,536 rows,
0.19 GiB). That 0.06 GiB and the CPU tile's temporaries make most of the 0.13 GiB GPPO measures above its estimate.
The other way, under checkpointing the plan adds up terms that peak at different moments (the head's tile comes
before any layer is recomputed): an upper bound, SFT's 7 % above the measurement here.

On 2 shared AMD EPYC cores (tensor peaks identical over 3 runs; RSS within 0.002 GiB), estimate / measured:
sft 1.548 / 1.609 GiB (0.96), sft-checkpointing 0.786 / 0.737 (1.07), gppo 1.388 / 1.514 (0.92),
gppo-checkpointing 0.708 / 0.733 (0.97). The formulas before tests/plan/test_memory_measured.py existed gave
0.65 / 0.69 / 0.67 / 0.69 of these peaks: they missed Qwen3's QK-norm and the fp32 copies its RMSNorms keep, K and V
repeated to every head under a mask, the head tile's full width, and that packed rows reach the model as one.

Prints the machine and the package versions, then per setting estimated vs measured (GiB), their ratio (min / median
/ max over --repeat runs), the parts. The estimate is the plan's own: the functions sft_memory / gppo_memory add up
for the actor, at one process (no DeepSpeed: ddp_model_states_bytes), for a klear.plan.shapes.Model read from the
saved config.json, checked against those functions' own breakdown. tests/plan/test_memory_measured.py runs each
setting and holds the estimate within TOLERANCE of the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from klear.plan.shapes import Model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks.repeat when run as a script
from benchmarks.repeat import add_repeat_argument, preamble  # noqa: E402

TOLERANCE = 0.25  # the bound: the estimate within 25 % of the measurement
STEPS = 2  # optimizer steps: the second runs with Adam's moments held
GIB = 1024 ** 3


@dataclass(frozen=True)
class Setting:
    """One measured run: the stage, its preset and overrides (the same config the child trains with and the plan
    estimates)."""

    name: str
    stage: str
    preset: str
    overrides: tuple[str, ...]


# Two micro-steps per optimizer step: the second runs with the first's gradients held, as a run's accumulation steps
# (the paper's layouts accumulate 8) do, where the plan's model states count them.
SFT_COMMON = ("max_length=1024", "per_device_batch_size=2", "gradient_accumulation_steps=2", "save_steps=100000",
              "logging_steps=1000")
GPPO_COMMON = ("per_device_batch_size=4", "num_generations=4", "prompts_per_update=2", "prompts_per_step=4",
               "max_prompt_length=128", "max_completion_length=384", f"max_steps={STEPS}", "save_steps=100000",
               "logging_steps=1000")
SETTINGS = {s.name: s for s in (
    Setting("sft", "sft", "tiny", (*SFT_COMMON, "gradient_checkpointing=false")),
    Setting("sft-checkpointing", "sft", "tiny", (*SFT_COMMON, "gradient_checkpointing=true")),
    Setting("gppo", "gppo", "tiny-math", (*GPPO_COMMON, "gradient_checkpointing=false")),
    Setting("gppo-checkpointing", "gppo", "tiny-math", (*GPPO_COMMON, "gradient_checkpointing=true")),
)}


# --------------------------------------------------------------------------- the model and the plan's estimate


def build_model(directory: Path) -> dict[str, Any]:
    """The measured model and its tokenizer, saved as a Hugging Face folder: klear.demo.tiny_model's, wider (25.6M
    parameters in Qwen3's proportions: the MLP 3 x hidden, 2 query heads per KV head; the demo tokenizer's 925
    tokens)."""
    from klear.demo.tiny_model import TinySpec, save_tiny_model

    return save_tiny_model(directory, TinySpec(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                               num_attention_heads=8, num_key_value_heads=4, head_dim=64))


def plan_model(config: dict[str, Any], name: str = "measured") -> Model:
    """The plan's Model from a config.json: the fields it reads."""
    from klear.plan.shapes import Model

    known = {f.name for f in fields(Model)} - {"name"}
    values = {key: value for key, value in config.items() if key in known}
    # transformers 5 writes "dtype" where earlier versions (and the shipped shapes) say "torch_dtype"
    values.setdefault("torch_dtype", config.get("dtype") or "float32")
    return Model(name=name, **values)


def load_setting(setting: Setting) -> Any:
    from klear.common.config import load_config
    from klear.gppo.config import GppoConfig
    from klear.sft.config import SftConfig

    return load_config(SftConfig if setting.stage == "sft" else GppoConfig, setting.preset, list(setting.overrides))


def estimate(setting: Setting, config_json: dict[str, Any]) -> dict[str, int]:
    """The plan's parts in bytes for this setting at one process: the functions sft_memory / gppo_memory add up for
    the actor, composed as they compose them. Their own breakdown (rounded to 0.1 GiB in the plan's report) must
    name the same parts at the same sizes, so a change to that composition fails here rather than going unmeasured."""
    from klear.plan import checks, memory
    from klear.plan.shapes import Cluster

    config = load_setting(setting)
    model = plan_model(config_json)
    total = checks.parameter_count(model)
    dtype = 2 if config.bf16 else 4
    checkpointing = config.gradient_checkpointing
    cluster = Cluster("measured", gpus_per_node=1, gpu_memory_gib=1024, cpus=2, memory_gib=1024, local_disk_gib=100)
    parts = {"model states (no DeepSpeed: unsharded)": memory.ddp_model_states_bytes(total)}
    if setting.stage == "sft":
        implementation = memory.attention_implementation(config.attn_implementation, config.packing)
        tokens = config.per_device_batch_size * config.max_length
        rows, length = (1, tokens) if config.packing else (config.per_device_batch_size, config.max_length)
        repeated = memory.repeats_kv(implementation, model, config.packing)
        parts |= {f"activations ({k})": v for k, v in memory.activation_bytes(model, tokens, dtype, checkpointing,
                                                                              repeated).items()}
        parts[f"attention ({implementation}, {'packed' if config.packing else 'unpacked'})"] = memory.attention_bytes(
            implementation, model, rows, length, dtype, config.packing, checkpointing)
        parts["fused LM head"] = memory.loss_head_bytes(model, tokens, dtype)
        _, plan = memory.sft_memory("overrides", config, model, total, cluster, 1)
    else:
        implementation = memory.attention_implementation(config.attn_implementation)
        tokens = config.per_device_batch_size * config.engine_length
        repeated = memory.repeats_kv(implementation, model, True)
        parts |= {f"activations ({k})": v for k, v in memory.activation_bytes(model, tokens, dtype, checkpointing,
                                                                              repeated).items()}
        parts[f"attention ({implementation}, padded)"] = memory.attention_bytes(
            implementation, model, config.per_device_batch_size, config.engine_length, dtype, True, checkpointing)
        parts["fused LM head"] = memory.loss_head_bytes(
            model, config.per_device_batch_size * config.max_completion_length, dtype)
        _, found = memory.gppo_memory("overrides", config, model, total, cluster, 1)
        plan = found["actor"]
    ours = {name: memory.gib(size) for name, size in parts.items()}
    if ours != plan["breakdown_gib"] or memory.gib(sum(parts.values())) != plan["gib_per_gpu"]:
        raise AssertionError(f"{setting.name}: the plan's own breakdown {plan['breakdown_gib']} is no longer the parts "
                             f"composed here {ours}: compose them as klear/plan/memory.py does now")
    return parts


# --------------------------------------------------------------------------- the child: one measured run


def _status(field: str) -> int:
    """A /proc/self/status size in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def peak_allocated(profiler: Any) -> int:
    """The maximum of the running sum of the CPU allocator's signed allocation sizes, in time order: the peak live
    tensor bytes during the profiled window, less those live when it began."""
    events = sorted((e.start_ns(), e.nbytes()) for e in profiler.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type().name == "CPU")
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return peak


class SavedTensors:
    """The storages autograd saves during the model's forward (a saved-tensors hook between a forward pre-hook and
    a forward hook on the model): each once, the parameters' excluded; L x L ones (the attention mask, its float
    copies) apart."""

    def __init__(self, model: Any, length: int) -> None:
        import torch

        self.model, self.length = model, length
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.current: dict[int, tuple[int, bool]] = {}
        self.passes: list[dict[str, int]] = []
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda saved: saved)
        model.register_forward_pre_hook(self.begin)
        model.register_forward_hook(self.end)

    def pack(self, tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.parameters and storage.device.type == "cpu":
            square = tensor.dim() == 4 and tensor.shape[-1] == tensor.shape[-2] == self.length
            self.current[storage.data_ptr()] = (storage.nbytes(), square)
        return tensor

    def begin(self, *_: Any) -> None:
        self.current = {}
        self.hooks.__enter__()

    def end(self, *_: Any) -> None:
        self.hooks.__exit__(None, None, None)
        self.passes.append({"activations": sum(n for n, square in self.current.values() if not square),
                            "attention L x L": sum(n for n, square in self.current.values() if square)})


def sft_trainer(model_dir: Path, config: Any, work: Path) -> Any:
    """klear.sft's trainer on STEPS optimizer steps of packed rows: documents of random tokens, a quarter of a row
    each (BFD packs four to a row, position ids restarting at each)."""
    import datasets
    import torch

    from klear.sft.stage import load_tokenizer, make_trainer, training_arguments

    tokenizer = load_tokenizer(model_dir, str(model_dir), config)
    document = config.max_length // 4
    count = 4 * config.per_device_batch_size * config.gradient_accumulation_steps * STEPS
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tokenizer), (count, document), generator=generator).tolist()
    rows = datasets.Dataset.from_dict({"input_ids": ids, "assistant_masks": [[1] * document] * count})
    args = training_arguments(config, work)
    args.max_steps = STEPS
    return make_trainer(model_dir, tokenizer, rows, args)


def gppo_trainer(model_dir: Path, config: Any, work: Path) -> Any:
    """klear.gppo's trainer whose generation round returns made-up rollouts of the full prompt + completion width."""
    import datasets
    import torch

    from klear.gppo.stage import load_tokenizer, make_trainer

    tokenizer = load_tokenizer(model_dir, str(model_dir), config)
    prompts = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "answer": str(2 * i)}
               for i in range(config.prompts_per_step)]
    trainer = make_trainer(model_dir, tokenizer, datasets.Dataset.from_list(prompts), config, work, pool=None)
    generator = torch.Generator().manual_seed(0)

    def rollouts(inputs: list[dict[str, Any]]) -> dict[str, Any]:
        rows = config.per_device_batch_size * trainer.args.steps_per_generation
        prompt, completion = config.max_prompt_length, config.max_completion_length
        positions = torch.arange(prompt + completion)
        # Prompts of varied length, left-padded; completions of varied length up to the longest, right-padded.
        starts = torch.randint(0, prompt // 2, (rows, 1), generator=generator)
        ends = prompt + torch.randint(completion // 2, completion + 1, (rows, 1), generator=generator)
        ends[0] = prompt + completion
        mask = ((positions >= starts) & (positions < ends)).long()
        ids = torch.randint(0, len(tokenizer), (rows, prompt + completion), generator=generator) * mask
        completion_mask = mask[:, prompt:]
        correct = (torch.rand(rows, generator=generator) < 0.5).float()
        return {"prompt_ids": ids[:, :prompt], "prompt_mask": mask[:, :prompt], "completion_ids": ids[:, prompt:],
                "completion_mask": completion_mask, "loss_mask": completion_mask,
                "advantages": torch.randn(rows, generator=generator), "correct": correct,
                "num_items_in_batch": completion_mask.sum().float(),
                "num_seqs_in_batch": torch.tensor(float(rows)),
                "num_sft_items": (completion_mask * correct.unsqueeze(1)).sum()}

    trainer._generate_and_score_completions = rollouts
    return trainer


def measure(setting: Setting, model_dir: Path) -> dict[str, Any]:
    """One measured run in this (fresh) process: the peak of live tensor bytes and the parts."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    rss_before_model = _status("VmRSS")
    config = load_setting(setting)
    with tempfile.TemporaryDirectory(prefix="bench-plan-memory-") as work:
        if setting.stage == "sft":
            trainer, length = sft_trainer(model_dir, config, Path(work)), config.per_device_batch_size * config.max_length
        else:
            trainer, length = gppo_trainer(model_dir, config, Path(work)), config.engine_length
        model = trainer.model
        weights = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                       for t in [*model.parameters(), *model.buffers()]}.values())
        saved = SavedTensors(model, length)
        started = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            trainer.train()
        seconds = time.perf_counter() - started
        moments = sum(t.untyped_storage().nbytes() for state in trainer.optimizer.state.values()
                      for t in state.values() if isinstance(t, torch.Tensor) and t.dim() > 0)
        return {"setting": setting.name, "peak_bytes": weights + peak_allocated(profiler), "weights_bytes": weights,
                "gradients_bytes": sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
                "optimizer_bytes": moments, "checkpointing": bool(config.gradient_checkpointing),
                "saved_bytes": {k: max(p[k] for p in saved.passes) for k in saved.passes[0]} if saved.passes else {},
                "forward_passes": len(saved.passes), "rss_peak_bytes": _status("VmHWM") - rss_before_model,
                "parameters": sum(p.numel() for p in model.parameters()), "seconds": seconds,
                "steps": trainer.state.global_step}


def run_child(setting: Setting, model_dir: Path, timeout: float = 600) -> dict[str, Any]:
    """`measure` in a fresh process (nothing of an earlier run live, glibc's mmap threshold fixed); its figures come
    back in a file, apart from what the libraries print."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="bench-plan-memory-result-") as tmp:
        result = Path(tmp) / "result.json"
        done = subprocess.run([sys.executable, __file__, "--child", setting.name, "--model", str(model_dir),
                               "--result", str(result)], env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)
        if done.returncode or not result.is_file():
            raise RuntimeError(f"{setting.name}: the measured run failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return json.loads(result.read_text())


# --------------------------------------------------------------------------- the report


def gib(size: float) -> str:
    return f"{size / GIB:.3f}"


def spread(values: list[float], form: str = "{:.3f}") -> str:
    return " / ".join(form.format(v) for v in (min(values), statistics.median(values), max(values)))


def report(setting: Setting, parts: dict[str, int], runs: list[dict[str, Any]]) -> str:
    """Estimated against measured, the ratio and the parts, min / median / max over the runs."""
    need = sum(parts.values())
    first = runs[0]
    states = first["weights_bytes"] + first["gradients_bytes"] + first["optimizer_bytes"]
    saved = "".join(f", saved {k} {gib(v)}" for k, v in first["saved_bytes"].items()) if not first["checkpointing"] \
        else " (saved tensors: not seen under checkpointing)"
    return "\n".join([
        f"{setting.name}: {setting.preset} + {' '.join(setting.overrides)}",
        f"  estimated {gib(need)} GiB; measured peak {spread([r['peak_bytes'] / GIB for r in runs])} GiB; estimate / "
        f"measured {spread([need / r['peak_bytes'] for r in runs])} (min / median / max of {len(runs)}); process RSS "
        f"peak {spread([r['rss_peak_bytes'] / GIB for r in runs])} GiB; {spread([r['seconds'] for r in runs], '{:.1f}')} "
        "s of training",
        "  estimated parts (GiB): " + ", ".join(f"{k} {gib(v)}" for k, v in parts.items()),
        f"  measured parts (GiB): model states {gib(states)} (weights {gib(first['weights_bytes'])} + gradients "
        f"{gib(first['gradients_bytes'])} + Adam {gib(first['optimizer_bytes'])}; {first['parameters']:,} parameters)"
        f"{saved}; the rest of the peak {gib(first['peak_bytes'] - states)}"])


def measured(names: list[str], repeats: int) -> Iterator[tuple[Setting, dict[str, int], list[dict[str, Any]]]]:
    """Each setting's estimate and `repeats` measured runs, on one saved model, setting by setting."""
    with tempfile.TemporaryDirectory(prefix="bench-plan-memory-model-") as tmp:
        model_dir = Path(tmp)
        build_model(model_dir)
        config_json = json.loads((model_dir / "config.json").read_text())
        for name in names:
            setting = SETTINGS[name]
            yield setting, estimate(setting, config_json), [run_child(setting, model_dir) for _ in range(repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_repeat_argument(parser)
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--child", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        Path(args.result).write_text(json.dumps(measure(SETTINGS[args.child], Path(args.model))))
        return
    print(preamble("torch", "transformers", "trl", "accelerate"), flush=True)
    for setting, parts, runs in measured(args.settings, args.repeat):
        print(report(setting, parts, runs), flush=True)


if __name__ == "__main__":
    main()
