"""How often math verdicts flip between math-verify 0.7.0 (the release's pin) and 0.9.0 (this project's pin).

    .venv/bin/python benchmarks/math_verify_versions.py --other-python /tmp/mv070/bin/python [--responses 2000]
        [--seed 0] [--jobs 1] [--examples 8] [--json figures.json]

The released Klear-Reasoner code pins math-verify==0.7.0 (requirements.txt) and judges math with
`math_verify_from_sky` twice: benchmarks/judge_math.py (evaluation: the whole response, gold stripped) and
verl/utils/reward_score/math_dapo.py `compute_score(is_longcot=True, is_use_math_verify=True)` (the RL reward:
-0.5 without </think>, -2 without <think>, else the text after the last </think>). This project pins 0.9.0 and
reproduces both (klear.verifiers.math_verifier.judge_official). A seeded generator writes AIME/HMMT/MATH-style
gold answers and responses (CATEGORIES x FORMS x PLACEMENTS, right and wrong); the same judging code (`judge_item`,
a copy of the release's functions) runs under this interpreter (0.9.0) and under `--other-python` (0.7.0), each
as `python this_file --worker` reading JSONL on stdin, so only the installed math-verify (with the
latex2sympy2_extended it pins) differs. Verdicts are compared per judge: agreement, flips 0.7.0 right -> 0.9.0
wrong and back (rates with Wilson 95% intervals), per answer category, form and placement, the first flipped
examples, and the hand-written cases of tests/verifiers/test_math.py (plus `\\boxed{25\\%}` against 25) apart.

The worker side imports nothing outside the standard library at module level: the 0.7.0 interpreter has only
math-verify installed.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HAND_CASES_FILE = ROOT / "tests" / "verifiers" / "test_math.py"
PACKAGES = ("math-verify", "latex2sympy2_extended", "sympy", "antlr4-python3-runtime")
SETUP_HINT = """\
--other-python: the interpreter of a second virtualenv with math-verify 0.7.0 (the release's pin), e.g.
    python3 -m venv /tmp/mv070 && /tmp/mv070/bin/pip install math-verify==0.7.0 antlr4-python3-runtime==4.13.2
(latex2sympy2_extended 1.10.1 comes with it; antlr4 and sympy as in this project's .venv, so only math-verify
and latex2sympy2_extended differ). The release's own environment (requirements.txt) also pinned sympy==1.13.1
and got antlr4 4.9.3 through omegaconf 2.3 (hydra-core); for that one:
    python3 -m venv /tmp/mv070rel && /tmp/mv070rel/bin/pip install math-verify==0.7.0 sympy==1.13.1 \\
        antlr4-python3-runtime==4.9.3
then run: .venv/bin/python benchmarks/math_verify_versions.py --other-python /tmp/mv070/bin/python"""

# The release's ScoringConfig (verl/utils/reward_score/reward_config.py).
CORRECT, INCORRECT, WO_EOS_THINK, WO_BOS_THINK = 1.0, -1.0, -0.5, -2.0
TIMEOUT_S = 5  # parse(parsing_timeout=5), verify(timeout_seconds=5) in both released judges
JUDGES = ("eval", "reward")  # judge_math.py; math_dapo.compute_score(is_longcot=True, is_use_math_verify=True)


# --- the release's judging, run under each math-verify ----------------------------------------------------
def math_verify_from_sky(solution_str: str, ground_truth: str | list[str], parse: Callable,
                         verify: Callable) -> tuple[float, str | None]:
    """The released `math_verify_from_sky` (judge_math.py and math_dapo.py hold the same body), call for call;
    it also returns what math-verify extracted (None when parse raised or found nothing), to show flips."""
    ground_truth = [ground_truth] if isinstance(ground_truth, str) else ground_truth
    try:
        math_verify_parsed = parse(solution_str, parsing_timeout=TIMEOUT_S)
    except Exception:  # noqa: BLE001 - as released: a response math-verify cannot parse is wrong
        return INCORRECT, None
    if len(math_verify_parsed) < 2:
        return INCORRECT, None
    extracted = str(math_verify_parsed[1])
    if math_verify_parsed[1] in ground_truth:  # the release's string match first
        return CORRECT, extracted
    for gt in ground_truth:
        try:
            if verify(parse(f"\\boxed{{{gt}}}", parsing_timeout=TIMEOUT_S), math_verify_parsed, timeout_seconds=TIMEOUT_S):
                return CORRECT, extracted
        except Exception:  # noqa: BLE001 - as released
            continue
    return INCORRECT, extracted


def release_reward(solution_str: str, ground_truth: str, parse: Callable, verify: Callable) -> tuple[float, str | None]:
    """math_dapo.compute_score(is_longcot=True, is_use_math_verify=True): the format checks, in the release's
    order, then the math-verify path on what follows the last </think>."""
    if "</think>" not in solution_str:
        return WO_EOS_THINK, None
    if "<think>" not in solution_str:
        return WO_BOS_THINK, None
    return math_verify_from_sky(solution_str.split("</think>")[-1], ground_truth, parse, verify)


def judge_item(gold: str, response: str, parse: Callable, verify: Callable) -> dict[str, Any]:
    """Both released judges on one response: judge_math.py gets the whole response and the stripped gold."""
    evaluated, eval_extracted = math_verify_from_sky(response, gold.strip(), parse, verify)
    reward, reward_extracted = release_reward(response, gold, parse, verify)
    return {"eval": evaluated, "eval_extracted": eval_extracted, "reward": reward, "reward_extracted": reward_extracted}


def installed_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def worker() -> None:
    """`python this_file --worker`: JSONL {gold, response} on stdin; a header with the installed versions, then
    one JSONL verdict per item on stdout."""
    import logging

    logging.disable(logging.WARNING)  # math-verify logs every parse timeout; the verdicts are unaffected
    from math_verify import parse, verify

    out = sys.stdout
    out.write(json.dumps({"versions": installed_versions()}) + "\n")
    for line in sys.stdin:
        if line.strip():
            item = json.loads(line)
            out.write(json.dumps(judge_item(item["gold"], item["response"], parse, verify)) + "\n")
    out.flush()


# --- the seeded generator ------------------------------------------------------------------------------
CATEGORIES = ("integer", "thousands", "negative", "fraction", "decimal", "percent", "radical", "pi", "interval",
              "set", "tuple", "units", "degrees", "dollars", "scientific", "equation", "expression", "choice")
# How the answer is written: in a box ($...$, \[...\], bare), several boxes, or without a box.
FORMS = ("boxed", "boxed_display", "boxed_bare", "several_boxes", "final_answer", "answer_is", "plain")
# Where it is: after </think>, only inside the thought, in both, cut off before </think>, no think tags at all.
PLACEMENTS = ("after_think", "in_thought", "both", "truncated", "no_think")
_PLACEMENT_WEIGHTS = (0.55, 0.1, 0.2, 0.1, 0.05)
FILLER = ("we", "consider", "the", "sum", "of", "both", "terms", "then", "factor", "and", "check", "each", "case",
          "so", "get", "note", "that", "hence", "substituting", "gives", "$x^2 + y^2$", "$\\frac{a}{b}$", "$n = 3$",
          "\\(a+b\\)", "$2k+1$", "wait,", "let me verify.", "\n")


def _squarefree(rng: random.Random) -> int:
    return rng.choice((2, 3, 5, 6, 7, 10, 11, 13, 14, 15, 17, 19, 21))


def _coprime(rng: random.Random) -> tuple[int, int]:
    while True:
        p, q = rng.randint(1, 40), rng.randint(2, 40)
        if math.gcd(p, q) == 1:
            return p, q


def _category_answers(category: str, rng: random.Random) -> tuple[str, list[str], list[str]]:
    """(gold, renderings a grader would accept, near misses) for one category; LaTeX as models write it."""
    if category == "integer":  # AIME: 0..999
        g = rng.randint(0, 999)
        return str(g), [str(g), f"{g:03d}", f"{g}.0", f"\\text{{{g}}}"], [str(g + rng.randint(1, 9)), str(g * 10 + 1)]
    if category == "thousands":
        g = rng.randint(1000, 999_999)
        return str(g), [str(g), f"{g:,}", f"{g:,}".replace(",", "{,}"), f"{g:,}".replace(",", "\\,")], [str(g + 1000), f"{g - 1:,}"]
    if category == "negative":
        g = -rng.randint(1, 500)
        return str(g), [str(g), f"- {-g}", f"({g})"], [str(-g), str(g - 1)]
    if category == "fraction":
        p, q = _coprime(rng)
        k = rng.randint(2, 5)
        gold = rng.choice((f"\\frac{{{p}}}{{{q}}}", f"{p}/{q}", f"\\dfrac{{{p}}}{{{q}}}"))
        tfrac = f"\\tfrac{p}{q}" if p < 10 and q < 10 else f"\\tfrac{{{p}}}{{{q}}}"  # \tfrac37: one-digit shorthand
        right = [f"\\frac{{{p}}}{{{q}}}", f"\\dfrac{{{p}}}{{{q}}}", f"{p}/{q}", f"\\frac{{{k * p}}}{{{k * q}}}", tfrac]
        return gold, right, [f"\\frac{{{q}}}{{{p}}}", f"\\frac{{{p + 1}}}{{{q}}}", f"{round(p / q, 2)}"]
    if category == "decimal":
        cents = rng.randint(1, 9999)
        dec = f"{cents / 100:.2f}"
        return dec, [dec, dec + "0", f"\\frac{{{cents}}}{{100}}", f"{cents}/100"], [f"{(cents + 1) / 100:.2f}", f"{cents / 100:.1f}"]
    if category == "percent":
        g = rng.randint(1, 99)
        gold = rng.choice((str(g), f"{g}\\%"))
        return gold, [f"{g}\\%", str(g), f"{g} \\%", f"{g}%", f"{g}\\text{{\\%}}", f"{g} \\text{{ percent}}"], \
            [f"{g + 1}\\%", f"{g / 100:g}", f"{100 - g}\\%"]
    if category == "radical":
        a, b = rng.randint(2, 9), _squarefree(rng)
        return f"{a}\\sqrt{{{b}}}", [f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}", f"{a} \\sqrt {b}" if b < 10 else
                                     f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{b}}} \\cdot {a}"], [f"{b}\\sqrt{{{a}}}", f"{a + 1}\\sqrt{{{b}}}"]
    if category == "pi":
        k, m = _coprime(rng)
        kpi = "\\pi" if k == 1 else f"{k}\\pi"
        return f"\\frac{{{kpi}}}{{{m}}}", [f"\\frac{{{kpi}}}{{{m}}}", f"\\frac{{{k}}}{{{m}}}\\pi", f"{kpi}/{m}",
                                         f"\\dfrac{{{kpi}}}{{{m}}}"], [f"\\frac{{{k + 1}\\pi}}{{{m}}}", f"{k * math.pi / m:.2f}"]
    if category == "interval":
        a = rng.randint(-9, 5)
        b = a + rng.randint(1, 9)
        if rng.random() < 0.3:
            return f"(-\\infty, {b})", [f"(-\\infty,{b})", f"\\left(-\\infty, {b}\\right)", f"(-\\infty, {b})"], \
                [f"(-\\infty, {b}]", f"({b}, \\infty)"]
        return f"({a}, {b}]", [f"({a},{b}]", f"\\left({a}, {b}\\right]", f"( {a} , {b} ]"], [f"[{a}, {b}]", f"({a}, {b})"]
    if category == "set":
        elems = sorted(rng.sample(range(-5, 20), rng.randint(2, 4)))
        shuffled = rng.sample(elems, len(elems))
        gold = "\\{" + ", ".join(map(str, elems)) + "\\}"
        return gold, [gold, "\\{" + ",".join(map(str, shuffled)) + "\\}", ", ".join(map(str, shuffled))], \
            ["\\{" + ", ".join(map(str, elems[:-1])) + "\\}", "\\{" + ", ".join(map(str, elems + [99])) + "\\}"]
    if category == "tuple":
        x, y = rng.randint(-9, 9), rng.randint(-9, 9)
        if x == y:
            y += 1
        return f"({x}, {y})", [f"({x},{y})", f"\\left({x}, {y}\\right)", f"(x, y) = ({x}, {y})"], [f"({y}, {x})", f"({x}, {y + 1})"]
    if category == "units":
        g = rng.randint(1, 500)
        unit = rng.choice(("cm", "meters", "inches", "feet", "km", "units", "square units", "hours", "minutes", "mph"))
        gold = rng.choice((str(g), f"{g} \\text{{ {unit}}}"))
        return gold, [f"{g} \\text{{ {unit}}}", f"{g}\\,\\text{{{unit}}}", f"{g} {unit}", f"{g}\\mbox{{ {unit}}}",
                      f"{g} \\mathrm{{{unit.split()[-1]}}}"], [f"{g + 1} \\text{{ {unit}}}", f"{g * 10} \\text{{ {unit}}}"]
    if category == "degrees":
        g = rng.choice((15, 30, 36, 45, 60, 72, 75, 90, 108, 120, 135, 150))
        gold = rng.choice((str(g), f"{g}^\\circ"))
        return gold, [f"{g}^\\circ", f"{g}^{{\\circ}}", f"{g} degrees", f"{g}\\text{{ degrees}}", f"{g}°"], \
            [f"{180 - g}^\\circ", f"{g + 5}^\\circ"]
    if category == "dollars":
        cents = rng.randint(100, 99_999)
        amount = f"{cents / 100:.2f}"
        gold = rng.choice((amount, f"\\${amount}"))
        return gold, [f"\\${amount}", f"{amount} \\text{{ dollars}}", f"\\$ {amount}", f"{amount} dollars",
                      f"\\text{{\\$}}{amount}"], \
            [f"\\${(cents + 10) / 100:.2f}", f"\\${cents}"]
    if category == "scientific":
        mant, exp = rng.randint(11, 99), rng.randint(3, 8)
        value = mant * 10 ** (exp - 1)
        sci = f"{mant / 10:g} \\times 10^{{{exp}}}"
        gold = rng.choice((str(value), sci))
        return gold, [str(value), sci, f"{mant / 10:g}\\cdot 10^{exp}", f"{mant / 10:g}e{exp}", f"{value:,}"], \
            [f"{mant / 10:g} \\times 10^{{{exp - 1}}}", str(value + 1)]
    if category == "equation":
        g = rng.randint(-20, 50)
        if rng.random() < 0.5:
            return str(g), [f"x = {g}", f"x={g}", str(g), f"n = {g}"], [f"x = {g + 1}", f"x = {-g - 1}"]
        a, b = rng.randint(2, 9), rng.randint(-9, 9)
        return f"y = {a}x + {b}" if b >= 0 else f"y = {a}x - {-b}", [f"y={a}x{b:+d}", f"y = {b} + {a}x", f"{a}x{b:+d}"], \
            [f"y = {a}x{b + 1:+d}", f"y = {b}x{a:+d}"]
    if category == "expression":
        r = rng.randint(1, 9)
        return f"x^2 + {2 * r}x + {r * r}", [f"(x+{r})^2", f"x^{{2}}+{2 * r}x+{r * r}", f"{r * r} + {2 * r}x + x^2"], \
            [f"(x-{r})^2", f"x^2 + {r}x + {r * r}"]
    if category == "choice":
        letters = "ABCDE"
        letter = rng.choice(letters)
        other = rng.choice(letters.replace(letter, ""))
        gold = rng.choice((letter, f"\\text{{({letter})}}", f"({letter})"))
        return gold, [letter, f"\\text{{({letter})}}", f"({letter})", f"\\textbf{{({letter})}}", f"\\text{{{letter}}}"], \
            [other, f"\\text{{({other})}}"]
    raise ValueError(f"unknown answer category {category!r}")


def _reasoning(rng: random.Random, low: int = 80, high: int = 900) -> str:
    words: list[str] = []
    size, target = 0, rng.randint(low, high)
    while size < target:
        words.append(rng.choice(FILLER) if rng.random() < 0.85 else str(rng.randint(1, 999)))
        size += len(words[-1]) + 1
    return " ".join(words)


def _statement(form: str, answer: str, other: str, rng: random.Random) -> str:
    """The sentence that gives the final answer in one of FORMS (`other`: the second answer of several boxes)."""
    if form == "boxed":
        return f"So the final answer is $\\boxed{{{answer}}}$."
    if form == "boxed_display":
        return f"Therefore\n\\[\n\\boxed{{{answer}}}\n\\]"
    if form == "boxed_bare":
        return f"The answer is \\boxed{{{answer}}}."
    if form == "several_boxes":
        if rng.random() < 0.5:  # an earlier attempt, then the final box
            return f"First I got $\\boxed{{{other}}}$, but correcting the sign, the answer is $\\boxed{{{answer}}}$."
        return f"It is either $\\boxed{{{other}}}$ or $\\boxed{{{answer}}}$."
    if form == "final_answer":
        return f"Final Answer: The final answer is ${answer}$. I hope it is correct."
    if form == "answer_is":
        return f"Thus the answer is ${answer}$."
    if form == "plain":
        return f"Therefore the answer is {answer}"
    raise ValueError(f"unknown answer form {form!r}")


def generate(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` seeded responses: categories in turn (every category by n = len(CATEGORIES)), form, placement and
    right/wrong drawn; `intended` is the generator's label (the rendering is the gold's or a near miss)."""
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    for i in range(n):
        category = CATEGORIES[i % len(CATEGORIES)]
        form = FORMS[(i // len(CATEGORIES)) % len(FORMS)] if i < len(CATEGORIES) * len(FORMS) else rng.choice(FORMS)
        placement = rng.choices(PLACEMENTS, _PLACEMENT_WEIGHTS)[0] if i >= len(PLACEMENTS) else PLACEMENTS[i]
        intended = "right" if rng.random() < 0.5 else "wrong"
        gold, right, wrong = _category_answers(category, rng)
        answer = rng.choice(right if intended == "right" else wrong)
        other = rng.choice(wrong if intended == "right" else right)
        final = _statement(form, answer, other, rng)
        thought = _reasoning(rng)
        if placement == "after_think":
            response = f"<think>\n{thought}\n</think>\n\n{_reasoning(rng, 0, 200)}\n{final}"
        elif placement == "in_thought":  # the summary after </think> gives no answer of its own
            response = f"<think>\n{thought}\n{final}\n</think>\n\nThe solution is worked out above."
        elif placement == "both":  # a candidate in the thought (the other answer or the same), the final after it
            candidate = _statement(rng.choice(FORMS), rng.choice((other, answer)), answer, rng)
            response = f"<think>\n{thought}\n{candidate}\n{_reasoning(rng, 20, 200)}\n</think>\n\n{final}"
        elif placement == "truncated":  # cut at max tokens: no </think>
            response = f"<think>\n{thought}\n{final}\n{_reasoning(rng, 20, 200)}"
        else:
            response = f"{thought}\n{final}"
        items.append({"id": i, "category": category, "form": form, "placement": placement, "intended": intended,
                      "gold": gold, "answer": answer, "response": response})
    return items


def hand_cases(path: Path = HAND_CASES_FILE) -> list[dict[str, Any]]:
    """The hand-written judging cases (`CASES` of tests/verifiers/test_math.py, read without importing it) as
    responses shaped like that test's `respond`, plus \\boxed{25\\%} against 25."""
    cases: list[tuple[str, str, bool]] = []
    if path.exists():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CASES" for t in node.targets):
                cases = ast.literal_eval(node.value)
    cases = [*cases, ("25", "25\\%", True)]
    reasoning = "<think>\n" + "Let me work through the problem carefully step by step. " * 40 + "\n</think>\n\n"
    return [{"id": f"hand{i}", "category": "hand", "form": "boxed", "placement": "after_think",
             "intended": "right" if want else "wrong", "gold": gold, "answer": pred,
             "response": reasoning + f"So the final answer is $\\boxed{{{pred}}}$."}
            for i, (gold, pred, want) in enumerate(cases)]


# --- running the two sides ---------------------------------------------------------------------------------
def run_side(python: str, items: list[dict[str, Any]], jobs: int) -> tuple[dict[str, str | None], list[dict[str, Any]]]:
    """Judge `items` with `python this_file --worker` in `jobs` processes; (installed versions, verdicts)."""
    shards = [items[j::jobs] for j in range(jobs)]
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for j, shard in enumerate(shards):
            src = Path(tmp) / f"in{j}.jsonl"
            src.write_text("".join(json.dumps({"gold": it["gold"], "response": it["response"]}) + "\n" for it in shard))
            with src.open() as stdin:
                procs.append(subprocess.Popen([python, "-I", str(Path(__file__).resolve()), "--worker"], stdin=stdin,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [p.communicate() for p in procs]
    versions: dict[str, str | None] = {}
    verdicts: list[dict[str, Any]] = [{} for _ in items]
    for j, ((out, err), proc) in enumerate(zip(outputs, procs)):
        lines = out.splitlines()
        if proc.returncode != 0 or len(lines) != len(shards[j]) + 1:
            raise SystemExit(f"{python} --worker failed (exit {proc.returncode}, {len(lines)} lines for "
                             f"{len(shards[j])} items):\n{err[-3000:]}")
        versions = json.loads(lines[0])["versions"]
        for k, line in enumerate(lines[1:]):
            verdicts[j + k * jobs] = json.loads(line)
    return versions, verdicts


def run_sides(other_python: str, this_python: str, items: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    """Both sides at once (each in its own processes), so a 2-core machine judges them side by side."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        old = pool.submit(run_side, other_python, items, jobs)
        new = pool.submit(run_side, this_python, items, jobs)
        return {"old": old.result(), "new": new.result()}


# --- figures ---------------------------------------------------------------------------------------------
def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (95% at z = 1.96); sound at k = 0, unlike the normal one."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(k: int, n: int) -> dict[str, Any]:
    low, high = wilson(k, n)
    return {"count": k, "n": n, "rate": k / n if n else 0.0, "ci95": [low, high]}


def flip_figures(items: list[dict[str, Any]], old: list[dict[str, Any]], new: list[dict[str, Any]],
                 judge: str, groups: Iterable[str] = ("category", "form", "placement")) -> dict[str, Any]:
    """Agreement and flips of one judge ("eval" or "reward"): right->wrong is CORRECT under 0.7.0 and not under
    0.9.0; wrong->right the reverse. Per group (category, form, placement): n and the flips each way."""
    n = len(items)
    down = [i for i in range(n) if old[i][judge] == CORRECT and new[i][judge] != CORRECT]
    up = [i for i in range(n) if old[i][judge] != CORRECT and new[i][judge] == CORRECT]
    differ = sum(old[i][judge] != new[i][judge] for i in range(n))  # also any change of a non-correct score
    figures: dict[str, Any] = {
        "responses": n, "agreement": rate(n - differ, n), "right_to_wrong": rate(len(down), n),
        "wrong_to_right": rate(len(up), n), "flips": rate(len(down) + len(up), n),
        "correct_070": rate(sum(o[judge] == CORRECT for o in old), n),
        "correct_090": rate(sum(v[judge] == CORRECT for v in new), n),
    }
    for group in groups:
        table: dict[str, dict[str, int]] = {}
        for item in items:
            row = table.setdefault(str(item[group]), {"n": 0, "right_to_wrong": 0, "wrong_to_right": 0})
            row["n"] += 1
        for i in down:
            table[str(items[i][group])]["right_to_wrong"] += 1
        for i in up:
            table[str(items[i][group])]["wrong_to_right"] += 1
        figures[f"by_{group}"] = table
    figures["flipped"] = [{"id": items[i]["id"], "direction": "right->wrong" if i in down else "wrong->right",
                           "category": items[i]["category"], "form": items[i]["form"],
                           "placement": items[i]["placement"], "gold": items[i]["gold"], "answer": items[i]["answer"],
                           "extracted_070": old[i][f"{judge}_extracted"], "extracted_090": new[i][f"{judge}_extracted"],
                           "score_070": old[i][judge], "score_090": new[i][judge]}
                          for i in sorted(set(down) | set(up))]
    return figures


def _pct(r: dict[str, Any]) -> str:
    low, high = r["ci95"]
    return f"{r['count']}/{r['n']} = {100 * r['rate']:.2f}% (95% CI {100 * low:.2f}-{100 * high:.2f}%)"


def print_figures(name: str, figures: dict[str, Any], examples: int, group_tables: bool = True) -> None:
    print(f"\n== {name}: {figures['responses']} responses")
    print(f"  verdict agreement:         {_pct(figures['agreement'])}")
    print(f"  right->wrong (0.7 -> 0.9): {_pct(figures['right_to_wrong'])}")
    print(f"  wrong->right (0.7 -> 0.9): {_pct(figures['wrong_to_right'])}")
    print(f"  correct under 0.7.0: {_pct(figures['correct_070'])}; under 0.9.0: {_pct(figures['correct_090'])}")
    for group in ("category", "form", "placement") if group_tables else ():
        rows = figures[f"by_{group}"]
        cells = [f"{key} {row['right_to_wrong']}+{row['wrong_to_right']}/{row['n']}" for key, row in rows.items()]
        print(f"  flips by {group} (right->wrong+wrong->right/n): " + ", ".join(cells))
    for ex in figures["flipped"][:examples]:
        print(f"    {ex['direction']} #{ex['id']} [{ex['category']}, {ex['form']}, {ex['placement']}] gold {ex['gold']!r} "
              f"answer {ex['answer']!r}: 0.7 extracted {ex['extracted_070']!r} -> {ex['score_070']:g}, "
              f"0.9 extracted {ex['extracted_090']!r} -> {ex['score_090']:g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # the judging side, see worker()
    parser.add_argument("--other-python", help="interpreter with math-verify 0.7.0 (see the hint printed without it)")
    parser.add_argument("--this-python", default=sys.executable, help="interpreter with math-verify 0.9.0 (this one)")
    parser.add_argument("--responses", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="worker processes per side (both sides run at once)")
    parser.add_argument("--examples", type=int, default=8, help="flipped examples shown per judge")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    if not args.other_python:
        print(SETUP_HINT, file=sys.stderr)
        raise SystemExit(2)
    generated, hand = generate(args.responses, args.seed), hand_cases()
    start = time.perf_counter()
    sides = run_sides(args.other_python, args.this_python, generated + hand, max(1, args.jobs))
    elapsed = time.perf_counter() - start
    (old_versions, old), (new_versions, new) = sides["old"], sides["new"]
    print(f"0.7.0 side: {args.other_python}: {old_versions}")
    print(f"0.9.0 side: {args.this_python}: {new_versions}")
    if old_versions.get("math-verify") != "0.7.0" or new_versions.get("math-verify") != "0.9.0":
        print("warning: the sides do not hold math-verify 0.7.0 and 0.9.0", file=sys.stderr)
    print(f"{len(generated)} generated responses (seed {args.seed}) + {len(hand)} hand-written cases, judged under both "
          f"versions in {elapsed:.0f} s")
    n = len(generated)
    figures: dict[str, Any] = {"seed": args.seed, "versions": {"070": old_versions, "090": new_versions}}
    for judge, title in (("eval", "evaluation (judge_math.py: whole response)"),
                         ("reward", "RL reward (math_dapo.compute_score: after the last </think>, format penalties)")):
        figures[judge] = flip_figures(generated, old[:n], new[:n], judge)
        print_figures(f"{title}, generated", figures[judge], args.examples)
        figures[f"{judge}_hand"] = flip_figures(hand, old[n:], new[n:], judge, groups=())
        print_figures(f"{title}, hand-written cases", figures[f"{judge}_hand"], args.examples, group_tables=False)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
        print(f"\nfigures written to {args.json}")


if __name__ == "__main__":
    main()
