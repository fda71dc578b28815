"""Group filtering, refill picks and re-batching across generation rounds."""

from __future__ import annotations

import pytest
import torch

from klear.gppo.batching import gather_rows, pick_groups, shortfall, varied_groups
from klear.gppo.trainer import PromptStream


def test_varied_groups_compares_rewards_exactly() -> None:
    keys = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5000001], dtype=torch.float64)
    assert varied_groups(keys, 4).tolist() == [False, True, True]
    with pytest.raises(ValueError, match="multiple of 4"):
        varied_groups(torch.zeros(6), 4)


def test_picks_informative_groups_first_then_fills_with_masked_ones() -> None:
    rounds = [[True, False, False, True], [False, True]]
    picks = pick_groups(rounds, quota=3, filter_groups=True)
    assert [(p.round, p.group, p.informative) for p in picks] == [(0, 0, True), (0, 3, True), (1, 1, True)]
    short = pick_groups([[False, True, False]], quota=3, filter_groups=True)
    assert [(p.group, p.informative) for p in short] == [(1, True), (0, False), (2, False)]
    unfiltered = pick_groups([[False, True, False, True]], quota=3, filter_groups=False)
    assert [(p.group, p.informative) for p in unfiltered] == [(0, False), (1, True), (2, False)]
    with pytest.raises(ValueError, match="quota"):
        pick_groups([[True]], quota=2, filter_groups=True)


def test_shortfall_is_the_worst_rank() -> None:
    assert shortfall([4, 1, 3], quota=4) == 3
    assert shortfall([5, 4], quota=4) == 0


def _round(prompt_len: int, completion_len: int, rows: int, offset: int) -> dict[str, torch.Tensor]:
    ids = torch.arange(rows * completion_len).view(rows, completion_len) + offset
    return {
        "prompt_ids": torch.full((rows, prompt_len), 7) + offset,
        "prompt_mask": torch.ones(rows, prompt_len, dtype=torch.long),
        "completion_ids": ids,
        "completion_mask": torch.ones(rows, completion_len, dtype=torch.long),
        "old_per_token_logps": -torch.rand(rows, completion_len),
        "advantages": torch.arange(rows, dtype=torch.float32) + offset,
        "num_items_in_batch": torch.tensor(99),
    }


def test_gather_rows_repads_prompts_left_and_completions_right() -> None:
    a, b = _round(3, 5, 4, 0), _round(2, 8, 2, 1000)
    out = gather_rows([a, b], [(1, 1), (0, 2)], pad_token_id=0)
    assert "num_items_in_batch" not in out  # batch-wide counts are recomputed by the caller
    assert out["prompt_ids"].tolist() == [[0, 1007, 1007], [7, 7, 7]]
    assert out["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out["completion_ids"][0].tolist() == b["completion_ids"][1].tolist()
    assert out["completion_ids"][1].tolist() == a["completion_ids"][2].tolist() + [0, 0, 0]
    assert out["completion_mask"][1].tolist() == [1] * 5 + [0] * 3
    assert torch.equal(out["old_per_token_logps"][1, :5], a["old_per_token_logps"][2])
    assert out["advantages"].tolist() == [1001.0, 2.0]


def test_gather_rows_refuses_what_it_cannot_rebatch() -> None:
    a = _round(3, 5, 2, 0)
    a["pixel_values"] = torch.zeros(2, 3, 4, 4)
    with pytest.raises(ValueError, match="pixel_values"):
        gather_rows([a], [(0, 0)], pad_token_id=0)


def test_prompt_stream_is_a_seeded_partition_that_resumes() -> None:
    ranks = [PromptStream(10, seed=3, rank=r, world_size=2) for r in range(2)]
    first = [s.take(5) for s in ranks]
    assert sorted(first[0] + first[1]) == list(range(10))  # one pass: every prompt once, split over ranks
    resumed = PromptStream(10, seed=3, rank=0, world_size=2)
    resumed.load_state_dict(ranks[0].state_dict())
    assert resumed.take(7) == ranks[0].take(7)


@pytest.mark.parametrize(("preset", "accumulation"), [("math", 8), ("code", 16)])
def test_paper_batch_layout_on_8_gpus(preset: str, accumulation: int, tmp_path) -> None:
    """128 prompts x 8 rollouts per round; optimizer steps on 16 (math) / 32 (code) prompts; groups stay on one rank."""
    from klear.common.config import load_config
    from klear.gppo.config import GppoConfig
    from klear.gppo.trainer import grpo_arguments

    config = load_config(GppoConfig, preset, ["bf16=false"])  # bf16 needs a GPU to construct TRL's config
    args = grpo_arguments(config, tmp_path, world_size=8, use_cpu=True, deepspeed=None, attn_implementation="sdpa",
                          prompts=1024)
    per_update = args.per_device_train_batch_size * 8 * args.gradient_accumulation_steps
    assert args.gradient_accumulation_steps == accumulation
    assert per_update == config.prompts_per_update * 8
    assert args.steps_per_generation * args.per_device_train_batch_size * 8 == 128 * 8  # one round, all ranks
    assert args.steps_per_generation // args.gradient_accumulation_steps == config.updates_per_step
    assert (args.steps_per_generation * args.per_device_train_batch_size) % config.num_generations == 0
    assert args.learning_rate == (1e-6 if preset == "math" else 5e-7) and args.beta == 0.0
    # the released script: 10 warm-up steps to a constant lr, weight decay 0.1
    assert args.lr_scheduler_type == "constant_with_warmup" and (args.warmup_steps, args.weight_decay) == (10, 0.1)
    assert args.temperature == 1.0 and args.num_generations == 8
    with pytest.raises(ValueError, match="split evenly"):
        grpo_arguments(config, tmp_path, world_size=3, use_cpu=True, deepspeed=None, attn_implementation="sdpa",
                       prompts=1024)
