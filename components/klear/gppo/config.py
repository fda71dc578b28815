"""Config of the gppo stage. Presets: math / code (the paper's two RL runs on Qwen3-8B after SFT),
tiny-math / tiny-code (the same code path on CPU with the tiny model)."""

from __future__ import annotations

from typing import ClassVar, Literal

import pydantic

from klear.common.config import StageConfig
from klear.common.tracking import TrackingSettings
from klear.verifiers.config import VerifierConfig

# Here rather than in losses.py, so that reward workers read this config without importing torch.
LossKind = Literal["ppo_clip", "clip_higher", "cispo", "gppo"]
Aggregation = Literal["token-mean", "micro-token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
ScheduleUnit = Literal["step", "round"]


class RewardConfig(pydantic.BaseModel):
    """How a rollout is scored. Defaults are the paper's; `official_*` switches reproduce the released code."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    # Paper: math is 1 when the last \boxed{} after </think> verifies, else 0; a response whose reasoning is
    # not enclosed in <think>...</think> gets `format_penalty` instead (the paper gives no value).
    format_penalty: float = pydantic.Field(-1.0, le=0, description="reward of a response whose reasoning is not in <think>...</think>")
    # Official code: -0.5 when </think> is missing, else -2.0 when <think> is missing (the release's order: a response
    # with neither tag gets -0.5), instead of format_penalty.
    official_format_penalties: bool = pydantic.Field(
        False, description="paper rules with the release's penalties: -0.5 without </think>, else -2 without "
        "<think>")
    # Paper: code reward = fraction of tests passed, in [0, 1]. Official code: mean of +1/-1 per test, in [-1, 1].
    code_reward: Literal["pass_fraction", "plus_minus"] = pydantic.Field(
        "pass_fraction", description="paper code reward: pass_fraction (tests passed, [0, 1]) or plus_minus (mean "
        "of ±1 per test)")
    # official: the released verl reward code wholesale (verl/utils/reward_score/math_dapo.py, code_r1_compute.py,
    # reward_config.py). A response without </think> scores -0.5, else one without <think> -2 (checked in that
    # order, nothing else about the tags); math +1 right / -1 wrong on the text after the last </think>, so a
    # missing end of thought ranks above a wrong answer; code: a program (the release's regex: the last "```python"
    # + newline block after the first </think>; ```py, ```Python, a bare ``` or an empty block: -1) runs on at most
    # `official_max_tests` tests drawn per rollout (seeded by problem and response, where the release drew
    # unseeded), `official_tests_at_once` at a time, `official_timeout_s` and `official_memory_mb` each (the verifier's
    # code_rules release: stdin programs bare, without helper imports; call-based ones after the release's
    # BASE_IMPORTS names; `official_packages` importable), a test passed when the program exits 0 with its output
    # equal after strip() (no token or number tolerance), reward the mean of +1 per pass and -1 per failure. The
    # three switches above and format_penalty do not apply then. paper: the paper's rules, with those switches.
    mode: Literal["paper", "official"] = pydantic.Field("paper", description="paper rules, or the released reward code's")
    official_max_tests: int = pydantic.Field(16, ge=1, description="official code: tests per rollout (MAX_TEST_CASES)")
    official_timeout_s: float = pydantic.Field(35.0, gt=0, description="official code: per test (firejail --timeout)")
    official_memory_mb: int = pydantic.Field(1024, ge=64, description="official code: address space (--rlimit-as=1024m)")
    official_tests_at_once: int = pydantic.Field(
        2, ge=1, description="official code: tests run at once per rollout (code_r1_compute MAX_WORKERS): 16 tests "
        "of 35 s end within 280 s")
    # What the release's image (docker/Dockerfile.ngc.vllm*) gave programs beyond the standard library, of what its
    # reward's code names (BASE_IMPORTS: numpy, pandas) or solutions import: numpy and pandas (pip-installed there),
    # sympy and networkx (torch's requirements), regex (transformers'); those installed here are offered, read-only.
    official_packages: tuple[str, ...] = pydantic.Field(
        ("numpy", "pandas", "sympy", "networkx", "regex"), description="official code: importable packages")
    # Which per-rollout value must vary within a group for the group to be trained on (zero-advantage filter):
    # accuracy (reward == the correct score: verified answer / all tests passed, well formatted), as the released
    # runs (filter_groups.metric=acc) for math and code; or the reward itself, which also keeps all-wrong groups whose
    # rollouts differ only in format penalties and trains them on the format signal alone.
    filter_on: Literal["accuracy", "reward"] = pydantic.Field("accuracy", description="accuracy (release) or reward")
    # The prompt already ends in "<think>\n" (a template that opens the think block itself).
    think_start_in_prompt: bool = pydantic.Field(
        False, description="the prompt already ends in <think> (a template that opens the think block)")

    # Worker processes with hard wall-clock budgets: a stuck reward is killed, scored `timeout_reward`, counted.
    workers: int = pydantic.Field(0, ge=0, description="reward processes; 0 = one per core of the CPU limit")
    budget_s: float = pydantic.Field(60.0, gt=0, description="wall-clock budget of one rollout's reward "
                                     "(release: 500, reward_manager/dapo.py TIMEOUT_PER_TASK)")
    timeout_reward: float = pydantic.Field(0.0, description="reward of a rollout over its budget or whose scorer "
                                           "raised (release: -1)")
    scorer: str = pydantic.Field("klear.gppo.rewards:score_rollout",
                                 description="module:function scoring one rollout task (tests plug in others)")


class GppoConfig(StageConfig, TrackingSettings):
    """GPPO settings; the tracking keys (report_to, tracking_uri, experiment, run_name, progress_seconds) are
    TrackingSettings' (klear/common/tracking.py)."""

    preset_package: ClassVar[str] = "klear.gppo"

    task: Literal["math", "code"] = pydantic.Field("math", description="which verifier scores the rollouts")

    # --- policy loss (paper §3: GPPO, ε_l = 0.2, ε_h = 0.28, token-level mean, no KL) ---
    loss: LossKind = pydantic.Field(
        "gppo", description="policy loss: gppo (paper), clip_higher (DAPO), ppo_clip, cispo")
    eps_low: float = pydantic.Field(
        0.2, gt=0, lt=1, description="ε_l: lower clip bound 1 − ε_l of the importance ratio")
    eps_high: float = pydantic.Field(0.28, gt=0, description="ε_h: upper clip bound 1 + ε_h (clip-higher, GPPO)")
    beta1: float = pydantic.Field(1.0, ge=0, description="GPPO Eq. 17: scales the gradient of δ < 1−ε_l, Ã < 0 tokens")
    beta2: float = pydantic.Field(1.0, ge=0, description="GPPO Eq. 17: scales the gradient of δ > 1+ε_h, Ã > 0 tokens")
    dual_clip: float | None = pydantic.Field(
        None, ge=1, description="caps negative-advantage losses at -c·Ã: the release's script sets 10; its code before "
        "2025-08-13 applied 1 whatever the script set")
    agg: Aggregation = pydantic.Field(
        "token-mean", description="token-mean: over all kept tokens of the mini-batch (paper); micro-token-mean: per "
        "micro-batch, weighted by its share of the mini-batch's rollouts (the release's verl)")
    sft_alpha: float = pydantic.Field(0.1, ge=0, description="α of the NLL term on correct rollouts (Eq. 13-14)")
    filter_zero_advantage: bool = pydantic.Field(True, description="drop groups whose reward.filter_on keys are all equal (§5.2.5)")

    # --- rollouts and batches (paper: 128 prompts x 8 rollouts per step, mini-batches of 16 / 32 prompts) ---
    num_generations: int = pydantic.Field(8, ge=2, description="rollouts per prompt")
    prompts_per_step: int = pydantic.Field(128, ge=1, description="prompts whose rollouts one generation round trains on")
    prompts_per_update: int = pydantic.Field(16, ge=1, description="prompts per optimizer step (off-policy mini-batch)")
    per_device_batch_size: int = pydantic.Field(8, ge=1, description="rollouts per device per forward/backward")
    oversample: float = pydantic.Field(1.0, ge=1.0, description="extra prompts drawn per round to refill filtered groups; "
                                       "the official runs generate for more prompts than they train on")
    max_refill_rounds: int = pydantic.Field(2, ge=0, description="extra generation rounds when the batch is still short")
    temperature: float = pydantic.Field(1.0, gt=0, description="rollout sampling temperature")
    top_p: float = pydantic.Field(1.0, gt=0, le=1, description="rollout nucleus sampling")
    max_prompt_length: int = pydantic.Field(
        2048, ge=8, description="prompt tokens at most (prompt_truncation says what happens past it)")
    prompt_truncation: Literal["skip", "left"] = pydantic.Field(
        "skip", description="a prompt over max_prompt_length: skipped (counted), or cut from the left (release)")
    max_completion_length: int = pydantic.Field(32768, ge=1, description="new tokens per rollout at most")

    # --- optimisation ---
    learning_rate: float = pydantic.Field(1e-6, gt=0, description="constant: 1e-6 math, 5e-7 code")
    max_steps: int = pydantic.Field(-1, description="optimizer steps; -1 = num_epochs over the data")
    num_epochs: float = pydantic.Field(
        1.0, gt=0, description="passes over the data when max_steps is -1, in schedule_unit's units")
    weight_decay: float = pydantic.Field(0.0, ge=0, description="AdamW weight decay")
    warmup_steps: int = pydantic.Field(0, ge=0, description="linear warm-up to learning_rate, then constant; counted "
                                       "in schedule_unit")
    schedule_unit: ScheduleUnit = pydantic.Field(
        "step", description="what warmup_steps and num_epochs count: step = optimizer steps and passes of TRL's sampler "
        "(paper presets); round = the release's verl: warm-up in generation rounds (the rate held within a round, "
        "round 0 at 0) and epochs of prompts / (prompts_per_step x oversample) rounds (klear/gppo/schedule.py)")
    max_grad_norm: float = pydantic.Field(1.0, gt=0, description="gradient clipping norm")
    seed: int = pydantic.Field(42, description="seed of sampling, data order and refills")

    # --- engines ---
    use_vllm: bool = pydantic.Field(True, description="vLLM rollouts (GPU); off = transformers generate (CPU)")
    vllm_mode: Literal["colocate", "server"] = pydantic.Field(
        "colocate", description="colocate: vLLM in the training processes; server: a separate `trl vllm-serve`")
    vllm_server_host: str = pydantic.Field("0.0.0.0", description="server mode: the vLLM server's host")
    vllm_server_port: int = pydantic.Field(8000, ge=1, le=65535, description="server mode: the vLLM server's port")
    vllm_gpu_memory_utilization: float = pydantic.Field(
        0.4, gt=0, le=1, description="colocate: the GPU memory share vLLM takes for weights and KV cache")
    vllm_tensor_parallel_size: int = pydantic.Field(1, ge=1, le=4096,
                                                    description="colocate: GPUs per vLLM engine (divides the processes)")
    vllm_enable_sleep_mode: bool = pydantic.Field(
        False, description="colocate, GPU only: release vLLM's weights and KV cache during the update (vLLM's sleep "
        "mode needs CUDA's memory pool; the CPU build has none)")
    vllm_sync_tolerance: float = pydantic.Field(
        0.0, ge=0, description="colocate: after every weight sync, fail if vLLM's log-prob of a fixed completion "
        "differs from the policy's by more than this (0 = no check)")
    vllm_is_correction: bool = pydantic.Field(True, description="truncated importance sampling: trainer vs vLLM log-probs")
    vllm_is_cap: float = pydantic.Field(3.0, ge=1, description="cap of the importance weight π_train / π_vllm")
    bf16: bool = pydantic.Field(True, description="bf16 training (GPU)")
    gradient_checkpointing: bool = pydantic.Field(True, description="recompute activations in the backward pass")
    attn_implementation: Literal["auto", "flash_attention_2", "sdpa", "eager"] = pydantic.Field(
        "auto", description="attention kernel; auto: flash_attention_2 where installed, else sdpa")
    deepspeed: str = pydantic.Field("", description="'zero3' (shipped), a JSON path, or '' for none")
    chat_template: Literal["model", "qwen3"] = pydantic.Field(
        "model", description="model: the tokenizer's own; qwen3: Qwen3's")

    # --- checkpoints and logs ---
    save_steps: int = pydantic.Field(50, ge=1, description="checkpoint every N optimizer steps")
    save_minutes: float = pydantic.Field(30.0, ge=0, description="also checkpoint once this many minutes have passed "
                                         "since the last checkpoint (0: by save_steps only)")
    keep_checkpoints: int = pydantic.Field(2, ge=1, description="checkpoints kept on object storage")
    resume: bool = pydantic.Field(True, description="resume from the output's latest checkpoint")
    logging_steps: int = pydantic.Field(1, ge=1, description="log every N optimizer steps")
    rollout_log: int = pydantic.Field(
        8, ge=0, description="rollouts of each generation round written to logs/rollouts.jsonl with the reward and "
        "reason they got (`klear reward --rollouts` rescores them); 0 = none")

    # --- validation during RL: the evaluation's own protocol and judge on a held-out set ---
    val_data: list[str] = pydantic.Field(
        default_factory=list, description="benchmark files for `klear evaluate --benchmark` (e.g. a slice of AIME or the "
        "demo benchmark); [] = no validation")
    val_every: int = pydantic.Field(0, ge=0, description="validate every N optimizer steps and at step 0; 0 = only at step 0 "
                                    "and the last step")
    val_config: str = pydantic.Field("tiny", description="the evaluate preset or YAML file: benchmarks, k samples per "
                                     "problem, sampling and judging settings")
    val_overrides: list[str] = pydantic.Field(default_factory=list, description="key=value overrides of val_config")

    reward: RewardConfig = RewardConfig()
    verifier: VerifierConfig = VerifierConfig()

    @pydantic.field_validator("max_steps")
    @classmethod
    def _steps_or_epochs(cls, value: int) -> int:
        if value == 0 or value < -1:  # transformers would run 1 step for 0 and |n| - 1 for a negative n
            raise ValueError("give a number of optimizer steps >= 1, or -1 for num_epochs over the data")
        return value

    @pydantic.model_validator(mode="after")
    def _batches_fit(self) -> GppoConfig:
        if self.prompts_per_step % self.prompts_per_update:
            raise ValueError(f"prompts_per_step {self.prompts_per_step} is not a multiple of prompts_per_update "
                             f"{self.prompts_per_update}")
        rollouts = self.prompts_per_update * self.num_generations
        if rollouts % self.per_device_batch_size:
            raise ValueError(f"a mini-batch of {rollouts} rollouts does not split into per_device_batch_size "
                             f"{self.per_device_batch_size}")
        if self.deepspeed and self.use_vllm and self.vllm_sync_tolerance > 0 and self.temperature != 1.0:
            # Under DeepSpeed the check scores the policy as TRL does, at the rollout temperature; vLLM's are raw.
            raise ValueError(f"vllm_sync_tolerance with deepspeed needs temperature 1.0 (got {self.temperature}): "
                             "set vllm_sync_tolerance=0 or temperature=1.0")
        return self

    @property
    def updates_per_step(self) -> int:
        """Optimizer steps per generation round: the off-policy mini-batches of one round."""
        return self.prompts_per_step // self.prompts_per_update

    @property
    def engine_length(self) -> int:
        """The colocated vLLM engine's max_model_len: the longest prompt plus the longest completion."""
        return self.max_prompt_length + self.max_completion_length


def accumulation_steps(cfg: GppoConfig, world_size: int) -> int:
    """Gradient accumulation steps of one optimizer update over `world_size` processes, so the update holds
    `prompts_per_update` x `num_generations` rollouts at any world size (TRL's rule: an update is
    per_device_train_batch_size x world size x gradient_accumulation_steps rollouts, and a generation round's
    prompts split evenly over the processes). The one rule the trainer (grpo_arguments) and `klear plan` apply;
    a ValueError names the values that do not split."""
    rollouts_per_update = cfg.prompts_per_update * cfg.num_generations
    per_step = cfg.per_device_batch_size * world_size
    if world_size < 1 or rollouts_per_update % per_step or cfg.prompts_per_step % world_size:
        raise ValueError(f"{rollouts_per_update} rollouts per update (prompts_per_update x num_generations) and "
                         f"prompts_per_step {cfg.prompts_per_step} must split evenly over {world_size} processes x "
                         f"per_device_batch_size {cfg.per_device_batch_size}")
    return rollouts_per_update // per_step
