"""Vectors of the release's schedule: the learning rate of every optimizer step, and the rounds of a run.

verl's actor scheduler is `get_constant_schedule_with_warmup` (verl/utils/torch_functional.py), built with the
script's `lr_warmup_steps` and stepped once per generation round after the round's optimizer steps
(fsdp_workers.update_actor); a run has len(train_dataloader) x total_epochs rounds (ray_trainer
`_create_dataloader`: batch_size gen_batch_size, drop_last=True).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.release_vectors.release import HEAD, functions, provenance

FILE = "verl/utils/torch_functional.py"
# (name, lr, lr_warmup_steps, optimizer steps per round (train batch / mini-batch), rounds)
RUNS = [("math script", 1e-6, 10, 128 // 16, 24), ("code script", 5e-7, 10, 128 // 32, 24),
        ("planted", 1e-3, 2, 2, 5), ("no warm-up", 1e-6, 0, 8, 3)]
# (usable prompts, gen_batch_size, total_epochs)
LENGTHS = [(30000, 256, 5), (1000, 256, 5), (256, 256, 5), (255, 256, 5), (16, 6, 2)]


def lr_per_step(schedule: Any, lr: float, warmup: int, updates_per_round: int, rounds: int) -> list[float]:
    """The rate of every optimizer step, stepping the release's scheduler as update_actor does: once per round."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = schedule(optimizer, num_warmup_steps=warmup)
    rates = []
    for _ in range(rounds):
        rates.extend([optimizer.param_groups[0]["lr"]] * updates_per_round)
        optimizer.step()  # no gradient: a no-op, in the order torch expects
        scheduler.step()
    return rates


def total_rounds(prompts: int, gen_batch_size: int, epochs: int) -> int:
    """ray_trainer: total_training_steps = len(train_dataloader) * total_epochs, the loader dropping the last
    partial batch (torch's DataLoader has StatefulDataLoader's length)."""
    loader = torch.utils.data.DataLoader(range(prompts), batch_size=gen_batch_size, drop_last=True)
    return len(loader) * epochs


def generate(git_dir: Path) -> dict[str, Any]:
    namespace: dict[str, Any] = {"LambdaLR": torch.optim.lr_scheduler.LambdaLR, "Optimizer": torch.optim.Optimizer}
    schedule = functions(git_dir, HEAD, FILE, ["get_constant_schedule_with_warmup"], namespace)[
        "get_constant_schedule_with_warmup"]
    return {
        "provenance": [provenance(git_dir, HEAD, FILE, "get_constant_schedule_with_warmup",
                                  stepped="once per round, after its optimizer steps (fsdp_workers.update_actor)"),
                       provenance(git_dir, HEAD, "verl/trainer/ppo/ray_trainer.py", "RayPPOTrainer._create_dataloader",
                                  note="len(train_dataloader) * total_epochs, drop_last=True")],
        "lr": [{"name": name, "learning_rate": lr, "lr_warmup_steps": warmup, "updates_per_round": updates,
                "rounds": rounds, "lr_per_step": lr_per_step(schedule, lr, warmup, updates, rounds)}
               for name, lr, warmup, updates, rounds in RUNS],
        "rounds": [{"prompts": prompts, "gen_batch_size": gen, "total_epochs": epochs,
                    "total_rounds": total_rounds(prompts, gen, epochs)} for prompts, gen, epochs in LENGTHS],
    }
