"""The RL learning-rate schedule and run length, in either of two units (GppoConfig.schedule_unit).

step: what the paper presets count, TRL's units. `warmup_steps` optimizer steps of linear warm-up
(transformers' constant_with_warmup: step s runs at s / W of the rate until s = W), and an epoch is a pass of
TRL's sampler over the data, `prompts_per_step` prompts per generation round.

round: what the released run scripts count, verl's units. verl's scheduler steps once per generation round
(fsdp_workers.update_actor), so every optimizer step of round r runs at min(1, r / max(1, W)) of the rate,
round 0 included (at rate 0, whatever W); an epoch is one pass of a `drop_last` loader drawing every prompt
of a round at once (ray_trainer: len(train_dataloader) x total_epochs rounds), here prompts_per_step x
oversample per round (the release draws gen_batch_size 256 for a batch of 128).
"""

from __future__ import annotations

import math

from klear.gppo.config import GppoConfig

__all__ = ["lr_factor", "planned_steps", "prompts_drawn_per_round", "round_of_step", "rounds_per_epoch",
           "verl_rounds"]


def prompts_drawn_per_round(cfg: GppoConfig) -> int:
    """Prompts one generation round draws before any refill: the batch plus the over-sampled extra."""
    if not cfg.filter_zero_advantage:
        return cfg.prompts_per_step
    return cfg.prompts_per_step + math.ceil((cfg.oversample - 1) * cfg.prompts_per_step)


def rounds_per_epoch(prompts: int, drawn_per_round: int) -> int:
    """Rounds of one verl epoch: whole batches of `drawn_per_round` prompts (the last partial one dropped)."""
    if drawn_per_round < 1:
        raise ValueError(f"a round must draw at least one prompt, got {drawn_per_round}")
    return prompts // drawn_per_round


def verl_rounds(cfg: GppoConfig, prompts: int) -> int:
    """Generation rounds of num_epochs verl epochs over `prompts` usable prompts (0 when not one round)."""
    return math.floor(rounds_per_epoch(prompts, prompts_drawn_per_round(cfg)) * cfg.num_epochs)


def planned_steps(cfg: GppoConfig, prompts: int) -> int:
    """TRL's max_steps for `prompts` usable prompts: `max_steps` when set; in round units num_epochs verl epochs
    of rounds, `updates_per_step` optimizer steps each; in step units -1 (TRL counts its own epochs)."""
    if cfg.max_steps > 0 or cfg.schedule_unit == "step":
        return cfg.max_steps
    rounds = verl_rounds(cfg, prompts)
    if rounds < 1:
        raise ValueError(f"{prompts} prompts make {rounds_per_epoch(prompts, prompts_drawn_per_round(cfg))} rounds "
                         f"per epoch of {prompts_drawn_per_round(cfg)} drawn prompts: num_epochs {cfg.num_epochs:g} "
                         "is not one round")
    return rounds * cfg.updates_per_step


def round_of_step(step: int, updates_per_round: int) -> int:
    """The generation round optimizer step `step` (0-based) belongs to."""
    return step // updates_per_round


def lr_factor(step: int, cfg: GppoConfig) -> float:
    """The multiplier of `learning_rate` at optimizer step `step` (0-based), under the config's schedule unit."""
    warmup = cfg.warmup_steps
    if cfg.schedule_unit == "round":
        return min(1.0, round_of_step(step, cfg.updates_per_step) / max(1, warmup))
    if warmup and step < warmup:
        return step / warmup
    return 1.0
