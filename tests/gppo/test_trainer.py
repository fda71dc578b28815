"""The GRPOTrainer subclass on the tiny model: parity with TRL's dapo loss, filtering, SFT term, learning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trl import GRPOTrainer
from trl.trainer.utils import split_tensor_dict

from klear.common.config import load_config
from klear.gppo.config import GppoConfig
from klear.gppo.rewards import RewardPool
from klear.gppo.stage import build_dataset, load_tokenizer, make_trainer

TOY = "tests.gppo.toy_scorers:"


def tiny_config(**overrides: Any) -> GppoConfig:
    sets = [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()]
    return load_config(GppoConfig, "tiny-math", sets)


@pytest.fixture()
def build(tiny_model: str, demo_files: list[str], tmp_path: Path):
    """A trainer factory; closes every reward pool it opened."""
    pools: list[RewardPool] = []

    def make(config: GppoConfig) -> Any:
        tokenizer = load_tokenizer(Path(tiny_model), tiny_model, config)
        dataset, _ = build_dataset(demo_files[:1], tokenizer, config)
        pool = RewardPool(config.reward, config.verifier)
        pools.append(pool)
        torch.manual_seed(config.seed)
        return make_trainer(Path(tiny_model), tokenizer, dataset, config, tmp_path / f"work{len(pools)}", pool)

    yield make
    for pool in pools:
        pool.close()


def first_round(trainer: Any) -> dict[str, Any]:
    trainer.model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    return trainer._generate_and_score_completions(batch)


def loss_and_grads(loss_fn: Any, trainer: Any, inputs: dict[str, Any]) -> tuple[float, torch.Tensor]:
    trainer.model.zero_grad()
    loss = loss_fn(trainer, trainer.model, inputs)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    return float(loss), grads


def test_same_loss_and_gradient_as_trl_dapo(build) -> None:
    """α = 0, no filtering, on-policy (ratio 1, clipping never triggers): our loss is TRL's dapo loss."""
    config = tiny_config(sft_alpha=0, filter_zero_advantage="false", reward__scorer=TOY + "digit_fraction")
    trainer = build(config)
    assert trainer.args.loss_type == "dapo"
    micro = split_tensor_dict(first_round(trainer), trainer.args.steps_per_generation)[0]
    assert micro["advantages"].abs().sum() > 0  # a batch with signal, else the comparison is empty
    ours, our_grads = loss_and_grads(type(trainer)._compute_loss, trainer, micro)
    trl_inputs = {k: v for k, v in micro.items() if k not in ("loss_mask", "correct", "num_seqs_in_batch", "num_sft_items")}
    theirs, their_grads = loss_and_grads(GRPOTrainer._compute_loss, trainer, trl_inputs)
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7)
    assert torch.allclose(our_grads, their_grads, rtol=1e-4, atol=1e-7)
    assert our_grads.abs().sum() > 0


def test_advantages_are_the_papers_group_normalised_rewards(build) -> None:
    """Eq. 4: Ã = (r − mean(group)) / (std(group) + ε), sample std, per group of num_generations rollouts.
    TRL computes them (over every rank's rewards, ε = 1e-4); GPPO trains on them as they are."""
    config = tiny_config(sft_alpha=0, filter_zero_advantage="false", reward__scorer=TOY + "digit_fraction")
    trainer = build(config)
    batch = first_round(trainer)
    rewards = torch.tensor([o.reward for o in trainer.verifier_reward.outcomes], dtype=torch.float32)
    groups = rewards.view(-1, trainer.num_generations)
    expected = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)
    assert expected.abs().sum() > 0  # a round with signal, else the comparison is empty
    assert torch.allclose(batch["advantages"].float().cpu(), expected, atol=1e-5)


def test_uninformative_groups_leave_the_loss_and_its_normaliser(build) -> None:
    config = tiny_config(sft_alpha=0, reward__scorer=TOY + "constant", max_refill_rounds=1)
    trainer = build(config)
    batch = first_round(trainer)
    assert batch["loss_mask"].sum() == 0 and batch["num_items_in_batch"] == 0
    assert trainer._metrics["train"]["fill_ratio"] == [0.0]
    assert trainer._metrics["train"]["refill_rounds"] == [1]  # it tried to refill before giving up
    assert trainer._metrics["train"]["groups_filtered_frac"] == [1.0]
    micro = split_tensor_dict(batch, trainer.args.steps_per_generation)[0]
    loss = trainer._compute_loss(trainer.model, micro)
    assert float(loss) == 0.0


def test_sft_term_sees_only_correct_rollouts(build) -> None:
    config = tiny_config(sft_alpha=1.0, filter_zero_advantage="false", reward__scorer=TOY + "digit_fraction")
    trainer = build(config)
    micro = split_tensor_dict(first_round(trainer), trainer.args.steps_per_generation)[0]
    micro["advantages"] = torch.zeros_like(micro["advantages"])  # policy term 0: what is left is α·NLL
    micro["correct"] = torch.zeros_like(micro["correct"])
    assert float(trainer._compute_loss(trainer.model, micro)) == 0.0
    micro["correct"][0] = 1.0
    micro["num_sft_items"] = micro["loss_mask"][0].sum() * trainer.accelerator.num_processes
    loss = float(trainer._compute_loss(trainer.model, micro))
    trainer.model.eval()
    with torch.no_grad():
        ids = torch.cat([micro["prompt_ids"][:1], micro["completion_ids"][:1]], dim=1)
        attention = torch.cat([micro["prompt_mask"][:1], micro["completion_mask"][:1]], dim=1)
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -micro["completion_ids"].size(1) - 1:-1]
        logps = torch.log_softmax(logits.float() / trainer.temperature, -1).gather(-1, micro["completion_ids"][:1, :, None])[..., 0]
    mask = micro["loss_mask"][:1].float()
    expected_nll = float(-(logps * mask).sum() / mask.sum())
    window = trainer.args.steps_per_generation / trainer.args.gradient_accumulation_steps
    assert loss == pytest.approx(expected_nll * window, rel=1e-4)


def test_it_learns_a_synthetic_task(tiny_model: str, demo_files: list[str], tmp_path: Path) -> None:
    """Reward = share of digits in the response. The random tiny model starts near 0.23 (the digits' share of
    what it emits); with GPPO, seed 42 and lr 3e-2 it passes 0.9 within 20 steps. Asserted: the mean reward of
    the last two rounds is at least 0.6, and 0.35 above the first round's."""
    from klear.gppo.stage import run

    config = tiny_config(reward__scorer=TOY + "digit_fraction", learning_rate=3e-2, max_steps=20, save_steps=100)
    report = run(tiny_model, demo_files[:1], str(tmp_path / "out"), config, work_dir=str(tmp_path / "work"))
    rewards = [row["reward"] for row in report["history"] if "reward" in row]
    assert len(rewards) == 10  # one generation round per two optimizer steps
    late = sum(rewards[-2:]) / 2
    assert late >= 0.6 and late >= rewards[0] + 0.35, rewards
    assert report["training"]["global_step"] == 20


def test_vllm_importance_weights_reach_the_loss(build) -> None:
    """With vLLM, TRL hands over per-token weights π_trainer/π_vllm (truncated at vllm_is_cap); the loss uses them."""
    config = tiny_config(sft_alpha=0, filter_zero_advantage="false", reward__scorer=TOY + "digit_fraction")
    trainer = build(config)
    micro = split_tensor_dict(first_round(trainer), trainer.args.steps_per_generation)[0]
    plain = float(trainer._compute_loss(trainer.model, micro))
    micro["importance_sampling_ratio"] = torch.full(micro["completion_ids"].shape, 2.0)
    assert float(trainer._compute_loss(trainer.model, micro)) == pytest.approx(2 * plain, rel=1e-5)
    assert trainer.args.vllm_importance_sampling_mode == "token_truncate"
    assert trainer.args.vllm_importance_sampling_clip_max == config.vllm_is_cap
