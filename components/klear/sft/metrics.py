"""Training metrics: tokens/s and packing efficiency added to the Trainer's logs (so TensorBoard gets it too), and a summary for KFP."""

from __future__ import annotations

import math
import time
from typing import Any

from transformers import TrainerCallback

TRACKED = ("loss", "learning_rate", "grad_norm", "tokens_per_second", "num_tokens", "mean_token_accuracy",
           "packing_efficiency")


def packing_ratio(lengths: list[int], max_length: int) -> float:
    """Tokens over the room of the packed rows (rows x max_length): 1.0 = no space wasted."""
    return sum(lengths) / (len(lengths) * max_length) if lengths and max_length > 0 else 0.0


def packing_efficiency(dataset: Any, max_length: int, packing: bool) -> float | None:
    """The packed dataset's packing ratio; None without packing (rows are then one sample each, padded per batch)."""
    if not packing or dataset is None or "seq_lengths" not in dataset.column_names:
        return None
    # TRL's packed rows list their samples' lengths: no token ids read into memory.
    lengths = [sum(row) for row in dataset["seq_lengths"]]
    return packing_ratio(lengths, max_length)


def tokens_per_second(tokens_before: float, tokens_now: float, seconds: float) -> float:
    return (tokens_now - tokens_before) / seconds if seconds > 0 else 0.0


class ThroughputLogger(TrainerCallback):
    """Adds `tokens_per_second` (TRL's cumulative `num_tokens` over wall time) to every training log.

    Must run before the TensorBoard callback, which writes the same `logs` dict: see `install`.
    """

    def __init__(self, packing_efficiency: float | None = None) -> None:
        self.history: list[dict[str, float]] = []
        self.packing_efficiency = packing_efficiency  # of the whole packed dataset, logged with every row
        self._last: tuple[float, float] | None = None

    def install(self, trainer: Any) -> None:
        trainer.callback_handler.callbacks.insert(0, self)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._last = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:
            return
        now = time.monotonic()
        tokens = float(logs.get("num_tokens", 0.0))
        if self._last is not None:
            logs["tokens_per_second"] = tokens_per_second(self._last[1], tokens, now - self._last[0])
        self._last = (now, tokens)
        if self.packing_efficiency is not None:
            logs["packing_efficiency"] = self.packing_efficiency
        self.history.append({"step": state.global_step, **{k: float(v) for k, v in logs.items() if k in TRACKED}})


def summarize(history: list[dict[str, float]], train_output: dict[str, float]) -> dict[str, float]:
    """Final figures for the KFP metrics output: last logged values, mean throughput, first and last loss."""
    summary: dict[str, float] = {}
    if history:
        last = history[-1]
        for key in ("loss", "learning_rate", "grad_norm"):
            if key in last:
                summary[f"final_{key}"] = last[key]
        summary["first_loss"] = history[0].get("loss", math.nan)
        rates = [h["tokens_per_second"] for h in history if "tokens_per_second" in h]
        if rates:
            summary["tokens_per_second"] = sum(rates) / len(rates)
        if "num_tokens" in last:
            summary["train_tokens"] = last["num_tokens"]
        if "packing_efficiency" in last:
            summary["packing_efficiency"] = last["packing_efficiency"]
    for key in ("train_loss", "train_runtime"):
        if key in train_output:
            summary[key] = float(train_output[key])
    return summary
