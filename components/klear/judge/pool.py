"""The judge as a library: sample rows + problems in, one Judgement per sample out, in input order.

    from klear.judge import Judge, JudgeConfig, resolve_problems, pass_rates
    with Judge(config) as judge:
        judgements = judge.judge(rows, resolve_problems(rows))     # rows: dicts with id, response, finish_reason, record
    table = pass_rates(row | j.to_dict() for row, j in zip(rows, judgements))

Verifier work runs on worker processes (klear.common.workers.WorkerPool running `klear.judge._worker`): one
pool per task kind, since a math judgement gets seconds and a program's test run minutes. Each sample is
judged within its kind's budget; an overrun kills the worker with its process group (budget_timeout), a
scorer that raises or a worker that dies gives scorer_error; the rest goes on. Workers get no secrets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from klear.common.parallel import resolve_workers
from klear.common.workers import WorkerPool
from klear.judge.config import JudgeConfig
from klear.judge.problems import Problem, problem_from_row
from klear.judge.scoring import Judgement, failed, prepare
from klear.verifiers.code_verifier import select_tests
from klear.verifiers.config import worker_verifier

__all__ = ["Judge", "ScorerFailedError", "judge_samples", "resolve_problems"]

log = logging.getLogger("klear.judge")

START_TIMEOUT_S = 120.0  # a worker imports math-verify and sympy before it says ready
CLOSE_GRACE_S = 5.0  # on close, time for workers to shut their sandbox pools down


def resolve_problems(samples: Sequence[Mapping[str, Any]], problems: Mapping[str, Problem] | None = None,
                     task: str = "auto") -> list[Problem | None]:
    """Each sample's problem: from `problems` by id (None: the id is unknown there), else from the sample's own
    `record` (the prompt's source row). A sample's own `final` column (`answer` in rows written before the rename)
    is the model's answer, never the gold: only its `record` is read."""
    if problems is not None:
        return [problems.get(str(s["id"])) for s in samples]
    parsed: dict[tuple[str, Any], Problem | None] = {}  # the samples of one prompt share one record: parse it once
    out = []
    for s in samples:
        key = (str(s["id"]), s.get("record"))
        if key not in parsed:
            problem = problem_from_row({"id": key[0], "record": key[1]}, task)
            parsed[key] = problem if problem is not None else Problem.make(key[0], None, None, None, None)
        out.append(parsed[key])
    return out


class ScorerFailedError(RuntimeError):
    """Every sample sent to the scorer failed with an error: the stage has failed, whatever it would publish."""


class Judge:
    """Judge samples on worker processes with hard per-sample budgets (see the module doc). A context manager;
    workers start on first use. `timeouts` / `errors` count budget overruns and scorer failures so far."""

    def __init__(self, config: JudgeConfig | None = None):
        self.config = config or JudgeConfig()
        self.workers = resolve_workers(self.config.workers)
        self._pools: dict[str, WorkerPool] = {}
        self.scored = 0  # samples sent to a scorer so far
        self.last_error = ""  # the latest scorer error's message

    def _pool(self, kind: str) -> WorkerPool:
        pool = self._pools.get(kind)
        if pool is None:
            c, cores, workers = self.config, resolve_workers(0), self.workers

            def setup(index: int) -> tuple[str, str]:  # each worker its own share of the sandbox slots
                return worker_verifier(c.verifier, index, workers, cores).model_dump_json(), c.scorer

            budget = c.math_budget_s if kind == "math" else c.code_budget_s
            pool = WorkerPool("klear.judge._worker", workers, setup, item_timeout_s=budget,
                              start_timeout_s=START_TIMEOUT_S, close_grace_s=CLOSE_GRACE_S, name=f"{kind} judge worker")
            self._pools[kind] = pool
        return pool

    @property
    def timeouts(self) -> int:
        return sum(p.timeouts for p in self._pools.values())

    @property
    def errors(self) -> int:
        return sum(p.errors for p in self._pools.values())

    def judge(self, samples: Sequence[Mapping[str, Any]], problems: Sequence[Problem | None]) -> list[Judgement]:
        """One Judgement per sample (rows with `response` and `finish_reason`), in order; `problems[i]` is sample
        i's problem, None when its id is unknown (verdict unknown_problem)."""
        if len(samples) != len(problems):
            raise ValueError(f"{len(samples)} samples but {len(problems)} problems")
        results: list[Judgement | None] = [None] * len(samples)
        pending: dict[str, list[tuple[int, dict[str, Any], str | None, int]]] = {"math": [], "code": []}
        for i, (sample, problem) in enumerate(zip(samples, problems)):
            if problem is None:
                results[i] = Judgement("none", False, 0.0, "unknown_problem")
                continue
            prepared = prepare(str(sample.get("response") or ""), sample.get("finish_reason"), problem,
                               self.config.verifier)
            if isinstance(prepared, Judgement):
                results[i] = prepared
            else:
                task, extracted = prepared
                runs = len(select_tests(problem.n_tests, self.config.verifier.max_tests, problem.id))
                pending[task["kind"]].append((i, task, extracted, runs))
        for kind, items in pending.items():
            if not items:
                continue
            pool = self._pool(kind)
            for (i, _, extracted, n_tests), reply in zip(items, pool.run([task for _, task, _, _ in items])):
                if reply.ok:
                    # official math: the parent extracted nothing, the worker's math-verify did
                    results[i] = Judgement(**{**reply.value, "extracted": extracted if extracted is not None
                                              else reply.value.get("extracted")})
                else:
                    total = 0 if kind == "math" else n_tests
                    verdict = "budget_timeout" if reply.status == "timeout" else "scorer_error"
                    results[i] = failed(kind, verdict, total, extracted)
                    log.debug("sample %s: %s (%s)", samples[i].get("id"), verdict, reply.message)
                    if verdict == "scorer_error":
                        self.last_error = str(reply.message)
            self.scored += len(items)
            if pool.last_timeouts or pool.last_errors:
                log.warning("%s judging: %d sample(s) over the %.0f s budget (workers killed and replaced), %d "
                            "scorer error(s); counted as wrong", kind, pool.last_timeouts, pool.item_timeout_s,
                            pool.last_errors)
        return [r for r in results if r is not None]

    def check_scorer_works(self) -> None:
        """Raise ScorerFailedError when every sample sent to a scorer failed with an error: a broken scorer (an
        import error, a wrong `scorer` setting) judged nothing, and its all-wrong verdicts are no result."""
        if self.scored and self.errors >= self.scored:
            raise ScorerFailedError(
                f"every one of the {self.scored} samples sent to the scorer {self.config.scorer} failed with an error "
                f"(the last: {self.last_error[-500:] or 'no message'}): the scorer is broken, not the samples; "
                "nothing published")

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools = {}

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def judge_samples(samples: Iterable[Mapping[str, Any]], problems: Mapping[str, Problem] | None = None,
                  config: JudgeConfig | None = None, judge: Judge | None = None) -> list[dict[str, Any]]:
    """The sample rows with the judgement fields added (kind, correct, score, verdict, passed, total, extracted).

    Problems come from `problems` by id, else from each sample's `record`. Pass an open `judge` to reuse its
    workers across calls; else one is started and closed here.
    """
    rows = [dict(s) for s in samples]
    config = config or (judge.config if judge else JudgeConfig())
    resolved = resolve_problems(rows, problems, config.task)
    if judge is not None:
        judgements = judge.judge(rows, resolved)
    else:
        with Judge(config) as own:
            judgements = own.judge(rows, resolved)
    return [{**row, **j.to_dict()} for row, j in zip(rows, judgements)]
