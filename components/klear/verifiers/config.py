"""Verifier settings shared by rl_filter, gppo and evaluate: the same numbers judge training and evaluation."""

from __future__ import annotations

from typing import ClassVar, Literal

import pydantic

from klear.common.chat import THINK_CLOSE
from klear.common.config import StageConfig

__all__ = ["VerifierConfig"]


# The code rules that extract, compare and offer packages as lcb_runner does (runner: also its execution artifacts).
LCB_RULES = ("official", "runner")
# The code rules whose call-based results travel as _zygote.encode_value values, compared with Python's `==` here.
VALUE_RULES = (*LCB_RULES, "release")


class VerifierConfig(StageConfig):
    preset_package: ClassVar[str] = "klear.verifiers"

    # --- math ---
    # strict: the last \boxed{} after `think_end`, truncated responses wrong (the harness's own rule).
    # official: as the released benchmarks/judge_math.py: math-verify over the whole response (thought included),
    # its last \boxed{} anywhere, else its last number; the finish reason ignored. The settings below are strict's.
    math_mode: Literal["strict", "official"] = pydantic.Field(
        "strict", description="strict: the last \\boxed{} after think_end, truncated responses wrong; official: "
        "as the released judge_math.py (math-verify over the whole response)")
    think_end: str = pydantic.Field(
        THINK_CLOSE, description="judge only what follows its last occurrence; '' judges the whole response")
    require_think_end: bool = pydantic.Field(
        True, description="a response without think_end (cut at max tokens) is wrong")
    require_box: bool = pydantic.Field(True, description="no \\boxed{} is wrong (off: math-verify's last number)")
    # Off (paper, official code): the last box is the answer, whatever boxes came before it ("first \boxed{205},
    # finally \boxed{204}" is judged on 204). On: boxes with different contents are a hedge, judged wrong.
    reject_conflicting_boxes: bool = pydantic.Field(
        False, description="boxes with different contents are a hedge, judged wrong (off: the last box counts)")
    math_workers: int = pydantic.Field(
        0, ge=0, description="math judging processes; 0 = one per core of the CPU limit")
    math_timeout_s: int = pydantic.Field(
        3, ge=1, description="math-verify's own parse and verify timeouts, whole seconds")
    math_item_timeout_s: float = pydantic.Field(
        10.0, gt=0, description="wall-clock limit of one math judgement: its worker is killed past it")

    # --- code ---
    # The code counterpart of math_mode. strict: the last ```python block after `think_end`, truncated responses
    # wrong, output compared token by token, the standard library only. official: as LiveCodeBench's lcb_runner
    # (extract_code, run_test): the last fenced block of the raw output whatever the finish reason, output lines
    # equal as text or as lists of Decimals, `official_packages` importable (read-only), ints printed up to 50,000
    # digits. Both run each test in a fresh confined process with real stdin (see README, LiveCodeBench parity).
    # runner: official plus lcb_runner's own execution artifacts, to reproduce its scores: stdin programs wrapped
    # in a function, its mocked stdin (no iteration, readlines with an empty last line, buffer.readline the
    # first line), stdout captured without .buffer, os.read(0)/os.write(1) missing the test; call-based tests in
    # order in one process sharing one module and one Solution (state leaks between tests).
    # release: the released verl code reward (code_r1_compute.py; gppo reward.mode official sets it): the last
    # ```python block after the first </think> by its exact regex, stdin programs run bare (no helper names, Python's
    # own recursion and int-digit limits), call-based ones with the release's BASE_IMPORTS names (_zygote
    # RELEASE_IMPORTS), a test passed when the exit code is 0 and stdout equals the expected output after strip(),
    # `official_packages` importable (read-only).
    code_rules: Literal["strict", "official", "runner", "release"] = pydantic.Field(
        "strict", description="strict (last ```python block, token comparison, standard library), official (as "
        "lcb_runner), runner (lcb_runner's own artifacts), release (the released RL code reward)")
    # LiveCodeBench's environment (its uv.lock) has these; those installed beside the verifier are offered (rules
    # official and runner; release: the gppo reward's official_packages, the released image's).
    official_packages: list[str] = pydantic.Field(
        default_factory=lambda: ["numpy", "scipy", "pandas", "sympy", "networkx", "regex"], description="packages "
        "programs may import (read-only) under the official, runner and release rules, those installed")
    code_mode: Literal["all", "first-failure"] = pydantic.Field(
        "all", description="all: run every test; first-failure: stop at the first failing test (LiveCodeBench)")
    max_tests: int | None = pydantic.Field(
        None, ge=1, description="tests per problem at most: a subset seeded by problem id; null = all")
    timeout_s: float = pydantic.Field(6.0, gt=0, description="wall-clock limit per test")
    memory_mb: int = pydantic.Field(2048, ge=64, description="address-space limit of a program (RLIMIT_AS)")
    output_limit_bytes: int = pydantic.Field(
        32 << 20, ge=1024, description="output a program may write before the test fails")
    file_limit_bytes: int = pydantic.Field(
        16 << 20, ge=0, description="largest file a program may write (RLIMIT_FSIZE)")
    nproc: int = pydantic.Field(32, ge=1, description="threads per program (processes are refused)")
    nofile: int = pydantic.Field(64, ge=8, description="open files per program")
    code_workers: int = pydantic.Field(0, ge=0, description="programs run at once; 0 = one per core of the CPU limit")
    slot_uid_base: int | None = pydantic.Field(
        61000, ge=1000, description="when root: the sandbox slots run as the first uids from this one up that no other "
                       "pool on the host holds; null = the caller's uid")
    # Development machines only: run with whatever of Landlock/seccomp the kernel offers, loudly logged.
    allow_unconfined: bool = pydantic.Field(
        False, description="development machines only: run with whatever of Landlock and seccomp the kernel "
        "offers")

    @property
    def lcb_rules(self) -> bool:
        """lcb_runner's extraction, comparison and packages (code_rules official or runner)."""
        return self.code_rules in LCB_RULES

    @property
    def offers_packages(self) -> bool:
        """Whether programs may import `official_packages` (every rule set but strict's standard library)."""
        return self.code_rules != "strict"


def worker_verifier(verifier: VerifierConfig, index: int, workers: int, cores: int) -> VerifierConfig:
    """Scoring worker `index`'s verifier settings: its share of the cores as sandbox slots, and slot uids no other
    worker uses. Every worker runs its own sandbox pool: `code_workers` = 0 would give each one a slot per core
    (cores² programs at once), and equal uids would let two workers' programs share RLIMIT_NPROC and signal each
    other."""
    slots = verifier.code_workers or max(1, cores // workers)
    base = verifier.slot_uid_base
    return verifier.model_copy(update={"code_workers": slots,
                                       "slot_uid_base": None if base is None else base + index * slots})
