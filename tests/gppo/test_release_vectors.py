"""This project against vectors computed by the released code's own functions (tests/release_vectors/*.json, each
with its provenance; `python -m tests.release_vectors.regenerate` remakes them from a fetched copy of the release):
the schedule in round units, the per-micro-batch loss with both dual-clip behaviours, the math reward and the format
penalties."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from klear.common.config import load_config
from klear.gppo.config import GppoConfig
from klear.gppo.losses import micro_batch_share, policy_loss, sft_loss
from klear.gppo.rewards import score_rollout
from klear.gppo.schedule import lr_factor, planned_steps

VECTORS = Path(__file__).parents[1] / "release_vectors"


def vectors(family: str) -> dict[str, Any]:
    return json.loads((VECTORS / f"{family}.json").read_text())


def release_config(**sets: Any) -> GppoConfig:
    return load_config(GppoConfig, "release-math", [f"{k}={v}" for k, v in sets.items()])


# --- schedule -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("run", vectors("schedule")["lr"], ids=lambda r: r["name"])
def test_learning_rate_of_every_step_is_verls(run: dict[str, Any]) -> None:
    per_update = 16
    config = release_config(learning_rate=run["learning_rate"], warmup_steps=run["lr_warmup_steps"],
                            prompts_per_update=per_update, prompts_per_step=per_update * run["updates_per_round"])
    ours = [config.learning_rate * lr_factor(step, config) for step in range(len(run["lr_per_step"]))]
    assert ours == pytest.approx(run["lr_per_step"], rel=1e-12, abs=0)
    # the paper presets count optimizer steps: the same warm-up ends updates_per_round times sooner
    by_step = config.model_copy(update={"schedule_unit": "step"})
    if run["lr_warmup_steps"]:
        assert [lr_factor(s, by_step) for s in range(len(ours))] != [lr_factor(s, config) for s in range(len(ours))]


@pytest.mark.parametrize("case", vectors("schedule")["rounds"], ids=lambda c: f"{c['prompts']}-{c['gen_batch_size']}")
def test_rounds_of_a_run_are_verls(case: dict[str, Any]) -> None:
    """prompts_per_step x oversample is the release's gen_batch_size: 128 x 2 = 256."""
    batch = case["gen_batch_size"] // 2
    config = release_config(prompts_per_step=batch, prompts_per_update=batch, per_device_batch_size=1,
                            num_epochs=case["total_epochs"])
    if case["total_rounds"] == 0:  # verl asserts len(train_dataloader) >= 1
        with pytest.raises(ValueError, match="is not one round"):
            planned_steps(config, case["prompts"])
        return
    assert planned_steps(config, case["prompts"]) == case["total_rounds"] * config.updates_per_step


def test_release_presets_count_rounds_as_the_scripts_do() -> None:
    """30,000 prompts: verl runs 117 rounds per epoch (256 drawn), 585 in 5 epochs, 8 (math) / 4 (code) updates
    each; the paper preset's TRL epochs are 234 rounds of 128."""
    math, code = load_config(GppoConfig, "release-math"), load_config(GppoConfig, "release-code")
    assert (planned_steps(math, 30000), planned_steps(code, 30000)) == (585 * 8, 585 * 4)
    assert [lr_factor(s, math) for s in (0, 7, 8, 79, 80)] == [0.0, 0.0, 0.1, 0.9, 1.0]


def test_a_planted_run_trains_at_verls_rate_on_every_step(tiny_model: str, demo_files: list[str],
                                                          tmp_path: Path) -> None:
    """The real trainer in round units: warm-up 2 rounds of 2 optimizer steps, 5 rounds; every step's logged rate
    equals what verl's scheduler gives the same values (0 in round 0, as verl's first round)."""
    from klear.gppo.stage import build_dataset, load_tokenizer, run

    run_vector = next(r for r in vectors("schedule")["lr"] if r["name"] == "planted")
    config = load_config(GppoConfig, "tiny-math", [
        "schedule_unit=round", f"warmup_steps={run_vector['lr_warmup_steps']}", f"learning_rate={run_vector['learning_rate']}",
        "prompts_per_step=4", "prompts_per_update=2", "reward.scorer=tests.gppo.toy_scorers:digit_fraction",
        "save_steps=100", "max_steps=-1"])
    prompts = len(build_dataset(demo_files[:1], load_tokenizer(Path(tiny_model), tiny_model, config), config)[0])
    per_epoch = prompts // 6  # 4 prompts + ceil(0.5 x 4) over-sampled per round
    config = config.model_copy(update={"num_epochs": run_vector["rounds"] / per_epoch})
    assert planned_steps(config, prompts) == len(run_vector["lr_per_step"])
    report = run(tiny_model, demo_files[:1], str(tmp_path / "out"), config, work_dir=str(tmp_path / "work"))
    rates = [row["learning_rate"] for row in report["history"]]
    assert rates == pytest.approx(run_vector["lr_per_step"], rel=1e-9, abs=1e-15)
    assert report["training"]["global_step"] == len(run_vector["lr_per_step"])


# --- policy loss ----------------------------------------------------------------------------------------------
def _ours(case: dict[str, Any], agg: str) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.tensor(case["log_prob"], dtype=torch.float64, requires_grad=True)
    old, adv = torch.tensor(case["old_log_prob"], dtype=torch.float64), torch.tensor(case["advantages"], dtype=torch.float64)
    mask, correct = torch.tensor(case["response_mask"], dtype=torch.float64), torch.tensor(case["correct"])
    clip = vectors("policy_loss")["clip"]
    total = torch.zeros((), dtype=torch.float64)
    for start, end in case["splits"]:
        part = slice(start, end)
        loss, _ = policy_loss("gppo", logp[part], old[part], adv[part], mask[part], eps_low=clip["eps_low"],
                              eps_high=clip["eps_high"], dual_clip=case["dual_clip"], agg=agg)  # type: ignore[arg-type]
        nll = sft_loss(logp[part], mask[part], correct[part])
        total = total + (loss + clip["positive_loss_coeff"] * nll) * micro_batch_share(
            agg, mask[part], mask.sum(), float(len(case["correct"])))  # type: ignore[arg-type]
    total.backward()
    assert logp.grad is not None
    return total.detach(), logp.grad


@pytest.mark.parametrize("case", vectors("policy_loss")["cases"], ids=lambda c: f"c{c['dual_clip']:g}-seed{c['seed']}")
def test_per_micro_batch_loss_and_gradient_are_the_releases(case: dict[str, Any]) -> None:
    """micro-token-mean with dual_clip 10 is the release from 2025-08-13, with dual_clip 1 the release before."""
    loss, grad = _ours(case, "micro-token-mean")
    assert float(loss) == pytest.approx(case["loss"], rel=1e-5)
    assert torch.allclose(grad, torch.tensor(case["grad_log_prob"], dtype=torch.float64), rtol=1e-4, atol=1e-7)
    # the paper's token-mean over the whole mini-batch is another loss on these unequal micro-batches
    paper, _ = _ours(case, "token-mean")
    assert abs(float(paper) - case["loss"]) > 1e-3


def test_the_two_dual_clips_differ_on_the_planted_batch() -> None:
    by_clip = {(c["dual_clip"], c["seed"]): c["loss"] for c in vectors("policy_loss")["cases"]}
    assert by_clip[(10.0, 0)] != pytest.approx(by_clip[(1.0, 0)])


# --- math reward and format penalties ------------------------------------------------------------------------
@pytest.mark.parametrize("case", vectors("math_reward")["cases"], ids=lambda c: c["name"])
def test_official_math_reward_is_the_releases(case: dict[str, Any]) -> None:
    config = load_config(GppoConfig, "release-math")
    task = {"task": "math", "response": case["response"], "answer": case["answer"]}
    assert score_rollout(task, config.reward, config.verifier).reward == case["reward"]


@pytest.mark.parametrize("case", [c for c in vectors("math_reward")["cases"] if c["reward"] in (-0.5, -2.0)],
                         ids=lambda c: c["name"])
def test_official_format_penalties_in_paper_mode_are_the_releases(case: dict[str, Any]) -> None:
    """Paper rules with the release's penalties: a response with no think tags at all gets -0.5 (</think> is
    checked first), as the release gives it."""
    config = load_config(GppoConfig, "math", ["reward.official_format_penalties=true"])
    task = {"task": "math", "response": case["response"], "answer": case["answer"]}
    assert score_rollout(task, config.reward, config.verifier).reward == case["reward"]
