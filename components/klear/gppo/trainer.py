"""GppoTrainer: TRL's GRPOTrainer (pinned) with our policy loss, the SFT term and over-sampled batches.

TRL generates the rollouts (vLLM on GPU, transformers on CPU), calls the reward function, computes
group-relative advantages and splits one generation round into off-policy mini-batches. This
subclass changes two things:

* `_generate_and_score_completions`: drops groups whose rewards are all equal and refills the batch
  from further prompts (batching.py), and records which rollouts are correct (for the SFT term);
* `_compute_loss`: `policy_loss` (ppo_clip / clip_higher / cispo / gppo) normalised over the kept
  tokens of the mini-batch like TRL's `dapo`, times vLLM's truncated importance weights, plus
  α × NLL of the correct rollouts.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from trl import GRPOConfig, GRPOTrainer

from klear.gppo.batching import gather_rows, pick_groups, shortfall, varied_groups
from klear.gppo.config import GppoConfig, accumulation_steps
from klear.gppo.losses import micro_batch_share, policy_loss, sft_loss
from klear.gppo.metrics import gradient_kept_fraction
from klear.gppo.schedule import lr_factor, planned_steps

if TYPE_CHECKING:
    from klear.gppo.rewards import RewardOutcome, RewardPool

log = logging.getLogger("klear.gppo")

STATE_FILE = "gppo_state.json"  # refill-stream position, beside TRL's files in every checkpoint


class PromptStream:
    """The prompts refill rounds draw from: a seeded permutation of the dataset, this rank's share of
    it, endlessly; its position is saved with every checkpoint so a resumed run draws the same prompts."""

    def __init__(self, size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        self.size, self.seed, self.rank, self.world_size = size, seed, rank, world_size
        self.position = 0
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def take(self, count: int) -> list[int]:
        taken = []
        for _ in range(count):
            epoch, offset = divmod(self.position * self.world_size + self.rank, self.size)
            if epoch != self._epoch:  # one permutation per pass over the data, not per prompt
                generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._epoch, self._order = epoch, torch.randperm(self.size, generator=generator)
            taken.append(int(self._order[offset]))
            self.position += 1
        return taken

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


class VerifierReward:
    """TRL reward function that scores rollouts in the reward pool; keeps each call's outcomes for the trainer,
    and writes the first rollouts of each call to a log when given one (`log_to`)."""

    __name__ = "verifier"

    def __init__(self, pool: RewardPool, task: str) -> None:
        self.pool, self.task = pool, task
        self.outcomes: list[RewardOutcome] = []
        self.seconds = 0.0  # wall time spent scoring, cumulative
        self.step = 0  # the optimizer step the rollouts are generated at, for the log
        self._log: Path | None = None
        self._log_count = 0

    def log_to(self, path: Path, count: int) -> None:
        """Append the first `count` rollouts of every call to `path` (JSONL), with their reward and reason."""
        self._log, self._log_count = (path, count) if count > 0 else (None, 0)

    def __call__(self, prompts: list, completions: list, completion_ids: list, **columns: Any) -> list[float]:
        tasks = [rollout_task(self.task, completion_text(c), {k: columns[k][i] for k in ("answer", "tests", "fn_name", "problem_id")
                                                               if k in columns}) for i, c in enumerate(completions)]
        started = time.perf_counter()
        self.outcomes = self.pool.score(tasks)
        self.seconds += time.perf_counter() - started
        if self._log is not None:
            self._log.parent.mkdir(parents=True, exist_ok=True)
            with self._log.open("a", encoding="utf-8") as log_file:
                for task, outcome in list(zip(tasks, self.outcomes))[:self._log_count]:
                    log_file.write(json.dumps(rollout_record(task, outcome, self.step)) + "\n")
        return [o.reward for o in self.outcomes]


def completion_text(completion: Any) -> str:
    """TRL passes a string, or for chat prompts a list with the assistant message."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion if m.get("role", "assistant") == "assistant")


# A code rollout's tests are logged with it up to this size; larger ones (some problems carry megabytes) are not.
LOGGED_TESTS_BYTES = 1 << 20


def rollout_record(task: dict[str, Any], outcome: RewardOutcome, step: int) -> dict[str, Any]:
    """One line of logs/rollouts.jsonl: what `klear reward --rollouts` reads, and what the rollout got."""
    record = {"step": step, **{k: v for k, v in task.items() if v is not None}}
    if task.get("tests") is not None:
        size = len(json.dumps(task["tests"]))
        if size > LOGGED_TESTS_BYTES:
            record.pop("tests")
            record["tests_bytes"] = size
    return {**record, "reward": outcome.reward, "reason": outcome.detail or outcome.reason, "outcome": outcome.reason,
            "correct": outcome.correct}


def rollout_task(task: str, response: str, row: dict[str, Any]) -> dict[str, Any]:
    """One scorer task: the response and what the verifier needs from the data row."""
    tests = row.get("tests")
    return {"task": task, "response": response, "answer": row.get("answer"),
            "tests": json.loads(tests) if isinstance(tests, str) and tests else (tests or None),
            "fn_name": row.get("fn_name") or None, "problem_id": str(row.get("problem_id", ""))}


def grpo_arguments(cfg: GppoConfig, output_dir: Path, world_size: int, use_cpu: bool, deepspeed: str | None,
                   attn_implementation: str, prompts: int) -> GRPOConfig:
    """TRL's config for the paper's batch layout: one generation round of `prompts_per_step` prompts,
    trained on as `updates_per_step` optimizer steps of `prompts_per_update` prompts each; `prompts` usable
    prompts set the run's length when it is counted in rounds (schedule.py)."""
    accumulation = accumulation_steps(cfg, world_size)  # the rule `klear plan` checks too
    by_step = cfg.schedule_unit == "step"  # round units: GppoTrainer.create_scheduler sets verl's schedule
    return GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=cfg.per_device_batch_size,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation * cfg.updates_per_step,
        num_generations=cfg.num_generations,
        num_iterations=1,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="constant_with_warmup" if cfg.warmup_steps and by_step else "constant",
        warmup_steps=cfg.warmup_steps if by_step else 0,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        max_steps=planned_steps(cfg, prompts),
        num_train_epochs=cfg.num_epochs,
        seed=cfg.seed,
        beta=0.0,  # no KL term, no reference model
        loss_type="dapo",  # TRL's token-level normalisation; our _compute_loss replaces the loss itself
        epsilon=cfg.eps_low,
        epsilon_high=cfg.eps_high,
        scale_rewards="group",
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_completion_length=cfg.max_completion_length,
        use_vllm=cfg.use_vllm,
        vllm_mode=cfg.vllm_mode,
        vllm_server_host=cfg.vllm_server_host,
        vllm_server_port=cfg.vllm_server_port,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        vllm_tensor_parallel_size=cfg.vllm_tensor_parallel_size,
        vllm_enable_sleep_mode=cfg.vllm_enable_sleep_mode,
        vllm_max_model_length=cfg.engine_length,
        vllm_importance_sampling_correction=cfg.vllm_is_correction,
        vllm_importance_sampling_mode="token_truncate",  # per-token weights: batching.py re-pads them per token
        vllm_importance_sampling_clip_max=cfg.vllm_is_cap,
        bf16=cfg.bf16,
        gradient_checkpointing=cfg.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if cfg.gradient_checkpointing else None,
        model_init_kwargs={"dtype": "bfloat16" if cfg.bf16 else "float32", "attn_implementation": attn_implementation},
        deepspeed=deepspeed,
        logging_steps=cfg.logging_steps,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=2,
        report_to="none",  # TensorBoard by the skeleton, MLflow / W&B by klear.common.tracking (one naming scheme)
        disable_tqdm=True,  # a progress line every progress_seconds instead
        log_completions=False,
        use_cpu=use_cpu,
    )


def sync_probe(tokenizer: Any) -> tuple[list[int], list[int]]:
    """A fixed prompt and completion for the weight-sync check: chat-formatted, with a reasoning block."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}],
                                           add_generation_prompt=True, tokenize=False)
    completion = "<think>\nAdd the tens, then the ones.\n</think>\n\nThe answer is 42."
    return (tokenizer(prompt, add_special_tokens=False)["input_ids"],
            tokenizer(completion, add_special_tokens=False)["input_ids"])


class GppoTrainer(GRPOTrainer):
    def __init__(self, *args: Any, gppo: GppoConfig, reward: VerifierReward, **kwargs: Any) -> None:
        self.gppo = gppo
        self.verifier_reward = reward
        super().__init__(*args, reward_funcs=[reward], **kwargs)
        self.refill = PromptStream(len(self.train_dataset), gppo.seed, self.accelerator.process_index,
                                   self.accelerator.num_processes)
        self.fill_ratio_min = 1.0
        self.reward_timeouts = 0
        self._rollout_seconds = 0.0  # cumulative wall time of generation rounds (rewards included)
        self._update_seconds = 0.0  # of the current optimizer step's forward/backward passes
        if self.use_vllm and self.vllm_mode == "colocate":
            # TRL's per-tensor load_weights fails on vLLM's CPU build; the in-place reload works on both.
            self.vllm_generation.sync_weights = self._sync_vllm_weights
            self.sync_gaps: list[float] = []

    def _sync_vllm_weights(self) -> None:
        from klear.gppo.vllm_sync import WeightSyncError, logprob_gap, push_weights

        generation = self.vllm_generation
        if generation.enable_sleep_mode:  # GPU only: sleep level 2 released the weights; map them again first
            torch.cuda.empty_cache()
            generation.llm.wake_up(tags=["weights"])
            generation._llm_weights_sleeping = False
        push_weights(generation.llm, generation._iter_named_params())  # gathers each parameter under ZeRO-3
        tolerance = self.gppo.vllm_sync_tolerance
        if tolerance <= 0:
            return
        prompt, completion = sync_probe(self.processing_class)
        # Under DeepSpeed the policy runs through TRL's own scoring (its fused head): a plain forward beside it
        # leaves ZeRO-3 parameters in flight for TRL's next one ("Cannot partition a param in flight").
        gap = logprob_gap(self.vllm_generation.llm, self.model, prompt, completion,
                          self._policy_logprobs if self.is_deepspeed_enabled else None)
        self.sync_gaps.append(gap)
        log.info("step %d: vLLM vs policy log-prob gap after the weight sync %.2e", self.state.global_step, gap)
        if gap > tolerance:
            raise WeightSyncError(f"step {self.state.global_step}: after the weight sync vLLM's log-probabilities "
                                  f"differ from the policy's by {gap:.3g} > vllm_sync_tolerance {tolerance:g}: "
                                  "vLLM is not sampling from the policy being trained")

    def _policy_logprobs(self, ids: list[int], completion_tokens: int) -> torch.Tensor:
        """The policy's log-probs of the last `completion_tokens` of `ids`, scored as TRL scores rollouts (at the
        rollout temperature: GppoConfig refuses the check under DeepSpeed unless it is 1, vLLM's are raw)."""
        input_ids = torch.tensor([ids], device=self.accelerator.device)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(self.model, input_ids, torch.ones_like(input_ids),
                                                                  completion_tokens)
        return logps[0]

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """In round units, verl's schedule (schedule.lr_factor): the rate moves once per generation round."""
        if self.gppo.schedule_unit == "step" or getattr(self, "lr_scheduler", None) is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        cfg = self.gppo
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer,
                                                              lambda step: lr_factor(step, cfg))
        self._created_lr_scheduler = True
        return self.lr_scheduler

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any) -> torch.Tensor:
        """Adds `time/update_s` per optimizer step: the step's wall time without its generation round."""
        started, rollouts_before = time.perf_counter(), self._rollout_seconds
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._update_seconds += time.perf_counter() - started - (self._rollout_seconds - rollouts_before)
        if self._step % self.current_gradient_accumulation_steps == 0:  # TRL counts micro-steps in _step
            self._metrics["train"]["time/update_s"].append(self._update_seconds)
            self._update_seconds = 0.0
        return loss

    # ------------------------------------------------------------------ rollouts

    def _refill_rows(self, prompts: int) -> list[dict[str, Any]]:
        rows = []
        for index in self.refill.take(prompts):
            rows.extend([dict(self.train_dataset[index])] * self.num_generations)
        return rows

    def _global_sums(self, **local: torch.Tensor | float) -> dict[str, torch.Tensor]:
        """Each figure summed over all ranks, in one collective."""
        values = torch.stack([torch.as_tensor(v, dtype=torch.float32, device=self.accelerator.device).reshape(())
                              for v in local.values()])
        totals = self.accelerator.gather(values.unsqueeze(0)).sum(dim=0)
        return dict(zip(local, totals))

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        cfg, group = self.gppo, self.num_generations
        if len(inputs) % group:
            raise ValueError(f"{len(inputs)} rollouts on this rank do not form whole groups of {group}")
        quota = len(inputs) // group
        self.verifier_reward.step = self.state.global_step
        started, reward_seconds = time.perf_counter(), self.verifier_reward.seconds
        filtering = cfg.filter_zero_advantage
        rows = inputs + (self._refill_rows(math.ceil((cfg.oversample - 1) * quota)) if filtering else [])
        rounds: list[dict[str, Any]] = []
        informative: list[list[bool]] = []
        timeouts = errors = correct_first = reward_first = 0.0
        while True:
            out = super()._generate_and_score_completions(rows)
            outcomes = self.verifier_reward.outcomes
            device = out["advantages"].device
            out["correct"] = torch.tensor([o.correct for o in outcomes], dtype=torch.float32, device=device)
            keys = torch.tensor([o.filter_key for o in outcomes], dtype=torch.float64)
            informative.append(varied_groups(keys, group).tolist())
            timeouts += sum(o.timed_out for o in outcomes)
            errors += sum(o.reason.startswith("error") for o in outcomes)
            if not rounds:
                correct_first = float(out["correct"].mean())
                reward_first = sum(o.reward for o in outcomes) / max(len(outcomes), 1)
            rounds.append(out)
            if not filtering or len(rounds) > cfg.max_refill_rounds:
                break
            found = sum(sum(flags) for flags in informative)
            counts = self.accelerator.gather(torch.tensor([found], device=device)).tolist()
            missing = shortfall(counts, quota)
            if missing == 0:
                break
            rows = self._refill_rows(math.ceil(missing * cfg.oversample))

        picks = pick_groups(informative, quota, filtering)
        batch = gather_rows(rounds, [(p.round, p.group * group + i) for p in picks for i in range(group)],
                            self._tokenizer.pad_token_id)
        keep = torch.tensor([p.informative or not filtering for p in picks], device=batch["completion_mask"].device)
        loss_mask = batch["completion_mask"] * keep.repeat_interleave(group).unsqueeze(1)
        if "tool_mask" in batch:
            loss_mask = loss_mask * batch["tool_mask"]
        batch["loss_mask"] = loss_mask
        total = self._global_sums(
            num_items_in_batch=loss_mask.sum(), num_seqs_in_batch=(loss_mask.sum(-1) > 0).sum(),
            num_sft_items=(loss_mask * batch["correct"].unsqueeze(1)).sum(),
            generated=sum(len(flags) for flags in informative),
            uninformative=sum(flags.count(False) for flags in informative),
            picked=sum(p.informative for p in picks), quota=quota, timeouts=timeouts, errors=errors,
            correct_first=correct_first, reward_first=reward_first,
            completion_tokens=sum(float(r["completion_mask"].sum()) for r in rounds))
        for key in ("num_items_in_batch", "num_seqs_in_batch", "num_sft_items"):
            batch[key] = total[key]
        fill = float(total["picked"] / total["quota"])
        self.fill_ratio_min = min(self.fill_ratio_min, fill)
        if fill < 1.0:
            log.warning("step %d: %.0f%% of the batch's groups are informative after %d refill round(s); the other "
                        "groups are masked out of the loss (raise oversample or max_refill_rounds, or check the "
                        "rewards)", self.state.global_step, 100 * fill, len(rounds) - 1)
        self.reward_timeouts += int(total["timeouts"])
        metrics = self._metrics["train"]
        metrics["accuracy"].append(float(total["correct_first"]) / self.accelerator.num_processes)
        # The stage's one task; named per task so math and code RL runs line up in one tracker.
        metrics[f"reward/{cfg.task}/mean"].append(float(total["reward_first"]) / self.accelerator.num_processes)
        metrics["groups_filtered_frac"].append(float(total["uninformative"] / total["generated"]))
        metrics["fill_ratio"].append(fill)
        metrics["refill_rounds"].append(len(rounds) - 1)
        metrics["reward_timeouts"].append(float(total["timeouts"]))
        metrics["reward_errors"].append(float(total["errors"]))
        elapsed, scoring = time.perf_counter() - started, self.verifier_reward.seconds - reward_seconds
        self._rollout_seconds += elapsed
        metrics["time/rewards_s"].append(scoring)
        metrics["time/generation_s"].append(elapsed - scoring)
        # All ranks' generated tokens over this rank's generation time: the ranks generate side by side.
        metrics["rollout_tokens_per_second"].append(float(total["completion_tokens"]) / max(elapsed - scoring, 1e-9))
        return batch

    # ------------------------------------------------------------------ loss

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        cfg = self.gppo
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True)
        mask = inputs["loss_mask"] if "loss_mask" in inputs else inputs["completion_mask"]
        old_logps = inputs.get("old_per_token_logps")
        old_logps = logps.detach() if old_logps is None else old_logps
        mean_loss, stats = policy_loss(
            cfg.loss, logps, old_logps, inputs["advantages"], mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
            beta1=cfg.beta1, beta2=cfg.beta2, dual_clip=cfg.dual_clip, agg=cfg.agg,
            token_weights=inputs.get("importance_sampling_ratio"))
        # policy_loss averages over this micro-batch; rescale so the mini-batch's micro-batches and ranks
        # together average over all of its kept tokens (TRL's `dapo` normalisation).
        mode = "train" if self.model.training else "eval"
        window = self.accelerator.num_processes
        if mode == "train":
            window /= self.current_gradient_accumulation_steps / self.args.steps_per_generation
        share = micro_batch_share(cfg.agg, mask, inputs["num_items_in_batch"] / window,
                                  inputs["num_seqs_in_batch"] / window)
        loss = mean_loss * share
        nll = torch.zeros((), device=logps.device)
        if cfg.sft_alpha > 0 and "correct" in inputs:
            nll = sft_loss(logps, mask, inputs["correct"])
            if cfg.agg == "micro-token-mean":  # the release adds α x the micro-batch's NLL before weighing it
                loss = loss + cfg.sft_alpha * nll * share
            else:  # the NLL's token mean over all correct tokens of the mini-batch
                sft_tokens = (mask * inputs["correct"].unsqueeze(1)).sum()
                loss = loss + cfg.sft_alpha * nll * sft_tokens / (inputs["num_sft_items"] / window).clamp(min=1.0)

        metrics = self._metrics[mode]
        for name, value in stats.items():
            metrics[name].append(value)
        metrics["gradient_kept_frac"].append(gradient_kept_fraction(cfg.loss, stats["clip_frac_low"], stats["clip_frac_high"],
                                                                    cfg.beta1, cfg.beta2))
        metrics["policy_loss"].append(float(mean_loss.detach()))
        metrics["sft_nll"].append(float(nll.detach()))
        tokens = inputs["completion_mask"]
        metrics["entropy"].append(float((entropies.detach() * tokens).sum() / tokens.sum().clamp(min=1)))
        return loss

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
            state = {"refill": self.refill.state_dict(), "reward_timeouts": self.reward_timeouts}
            (folder / STATE_FILE).write_text(json.dumps(state))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        path = Path(checkpoint) / STATE_FILE if checkpoint else None
        if path is not None and path.is_file():
            state = json.loads(path.read_text())
            self.refill.load_state_dict(state["refill"])
            self.reward_timeouts = int(state.get("reward_timeouts", 0))
            log.info("refill stream resumed at position %d", self.refill.position)
