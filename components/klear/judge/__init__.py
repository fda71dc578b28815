"""The judge: sampled responses in, per-sample correctness and per-problem pass rates out.

The one place that turns samples into pass rates: the `klear judge` stage, and a library for sft-data,
rl-filter and evaluate.

    from klear.judge import Judge, JudgeConfig, judge_samples, pass_rates, resolve_problems
    rows = judge_samples(sample_rows, problems=None, config=JudgeConfig())   # + kind, correct, score, verdict, ...
    table = pass_rates(rows)                                                 # id -> PassRate(samples, correct, pass_rate)

    with Judge(config) as judge:                                             # reuse the workers across batches
        judgements = judge.judge(rows, resolve_problems(rows, problems_by_id))
"""

from klear.judge.config import JudgeConfig
from klear.judge.pool import Judge, judge_samples, resolve_problems
from klear.judge.problems import Problem, load_problems, problem_from_row
from klear.judge.rates import PassRate, pass_rates
from klear.judge.scoring import Judgement

__all__ = ["Judge", "JudgeConfig", "Judgement", "PassRate", "Problem", "judge_samples", "load_problems",
           "pass_rates", "problem_from_row", "resolve_problems"]
