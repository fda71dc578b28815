"""Validation during RL: at step 0, every `val_every` optimizer steps and at the last step, the policy is evaluated on
`val_data` exactly as `klear evaluate --model` would evaluate it (the same protocol: prompts, k samples per
problem, sampling settings and seeds, judge), and pass@1 ± stderr per benchmark is logged as `val/<benchmark>/...`.

The policy is saved as a finished model folder (the published model's form) and sampled by klear.sample from it,
so a separate `klear evaluate` of the published model gives the same numbers. On GPU the sampler is a second
engine beside training's: leave it room (vllm_gpu_memory_utilization). Training's random state is restored
afterwards: validation does not change the run it observes.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger("klear.gppo")


def due(step: int, every: int, max_steps: int) -> bool:
    """Step 0, every `every` steps (0: none between) and the last step."""
    return step == 0 or step == max_steps or (every > 0 and step % every == 0)


def val_scores(report: Mapping[str, Any], label: str = "model") -> dict[str, float]:
    """`val/<benchmark>/pass@1`, `.../stderr`, `.../truncated` (percent, as the evaluation reports them) and
    `val/pass@1`, the mean over benchmarks, from an evaluation report."""
    scores: dict[str, float] = {}
    benchmarks = report["models"][label]["benchmarks"]
    for name, block in benchmarks.items():
        scores[f"val/{name}/pass@1"] = float(block["pass@1"])
        if block.get("stderr") is not None:
            scores[f"val/{name}/stderr"] = float(block["stderr"])
        if block.get("truncated") is not None:
            scores[f"val/{name}/truncated"] = float(block["truncated"])
    if benchmarks:
        scores["val/pass@1"] = sum(float(b["pass@1"]) for b in benchmarks.values()) / len(benchmarks)
    return scores


class Validation(TrainerCallback):
    """Runs the evaluation on the policy when `due`; keeps each result in `history` (for the report)."""

    def __init__(self, trainer: Any, val_data: list[str], val_config: str, every: int, work: Path, tokenizer: Any,
                 overrides: Sequence[str] = ()) -> None:
        from klear.common.config import load_config
        from klear.evaluate.config import EvaluateConfig

        self.trainer, self.val_data, self.every, self.work, self.tokenizer = trainer, list(val_data), every, work, tokenizer
        self.config = load_config(EvaluateConfig, val_config, list(overrides))
        self.history: list[dict[str, float]] = []
        self._done: set[int] = set()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 0:
            self.validate(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if due(state.global_step, self.every, state.max_steps):
            self.validate(state.global_step)

    def validate(self, step: int) -> dict[str, float]:
        """Every rank takes part (saving gathers ZeRO-3 shards); rank 0 samples and judges."""
        import numpy as np
        import torch

        from klear.evaluate.stage import sample_then_run
        from klear.training.hf_model import finish_model_folder

        if step in self._done:  # a resumed run's step 0 or a last step that is also a multiple
            return {}
        self._done.add(step)
        trainer = self.trainer
        started = time.perf_counter()
        folder = self.work / "validation" / f"step-{step}"
        model_dir = folder / "model"
        if trainer.is_world_process_zero():
            shutil.rmtree(folder, ignore_errors=True)
        trainer.save_model(str(model_dir))
        scores: dict[str, float] = {}
        if trainer.is_world_process_zero():
            states = random.getstate(), np.random.get_state(), torch.get_rng_state()
            cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
            was_training = trainer.model.training
            try:
                finish_model_folder(model_dir, self.tokenizer)
                report = sample_then_run(str(folder / "report"), self.config, self.val_data, model=str(model_dir),
                                         sample_output=str(folder / "samples"))
            finally:
                random.setstate(states[0])
                np.random.set_state(states[1])
                torch.set_rng_state(states[2])
                if cuda_states is not None:
                    torch.cuda.set_rng_state_all(cuda_states)
                trainer.model.train(was_training)
            shutil.rmtree(model_dir, ignore_errors=True)  # the report and samples stay for a look in the pod
            scores = {**val_scores(report), "val/seconds": time.perf_counter() - started}
            self.history.append({"step": float(step), **scores})
            log.info("validation at step %d: %s", step, ", ".join(f"{k} {v:.4g}" for k, v in scores.items()))
            # Straight to the callbacks (trackers, curves): Trainer.log would take the step's pending rollout figures.
            trainer.callback_handler.on_log(trainer.args, trainer.state, trainer.control, dict(scores))
        trainer.accelerator.wait_for_everyone()
        return scores
