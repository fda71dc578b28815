"""Math answer checking: extract the final boxed answer, then judge it with math-verify in worker processes.

math-verify's timeouts use SIGALRM, which works only on a process's main thread, and a pathological
expression can still stall sympy: each worker is a process serving items on its main thread, and the
parent kills (and replaces) a worker that overruns an item's wall-clock budget, with its process group.
The workers (klear.common.workers.WorkerPool running `klear.verifiers._math_worker`) get no secrets.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from klear.common.chat import THINK_CLOSE, answer_section, format_fault
from klear.common.parallel import resolve_workers
from klear.common.workers import WorkerPool
from klear.verifiers.config import VerifierConfig

__all__ = ["Extraction", "MathResult", "MathVerifier", "extract_answer", "find_boxes", "format_ok", "judge_official",
           "official_window_start", "parse_official"]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
START_TIMEOUT_S = 60.0  # a worker imports math-verify (and sympy) before it says ready


# --- pure extraction ---------------------------------------------------------------------------
def find_boxes(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` (or `\\fbox{...}`, `\\boxed 5`) in order; nested braces handled."""
    found: list[tuple[int, str]] = []
    for command in _BOX_COMMANDS:
        start = text.find(command)
        while start != -1:
            i = start + len(command)
            while i < len(text) and text[i] == " ":
                i += 1
            if i < len(text) and text[i] == "{":
                depth, j = 0, i
                while j < len(text):
                    ch = text[j]
                    if ch == "\\":
                        j += 2  # an escaped brace \{ does not open a group
                        continue
                    if ch == "{":
                        depth += 1
                    elif ch == "}":
                        depth -= 1
                        if depth == 0:
                            found.append((start, text[i + 1 : j]))
                            break
                    j += 1
                # an unclosed box (response cut off) is no answer
            elif i > start + len(command):  # `\boxed 5`: one token up to whitespace or `$`
                j = i
                while j < len(text) and not text[j].isspace() and text[j] != "$":
                    j += 1
                if j > i:
                    found.append((start, text[i:j]))
            start = text.find(command, i)
    return [content for _, content in sorted(found)]


@dataclass(frozen=True)
class Extraction:
    answer: str | None  # what will be judged; None means wrong without judging
    reason: str  # ok, no_think_end, no_box, empty_box, conflicting_boxes, no_box_fallback


def _norm(s: str) -> str:
    return "".join(s.split())


def extract_answer(response: str, think_end: str = THINK_CLOSE, require_think_end: bool = True,
                   require_box: bool = True, reject_conflicting: bool = False) -> Extraction:
    """The final answer to judge: the last box after the end of thinking (klear.common.chat.answer_section).

    With `reject_conflicting`, several boxes with different contents are a hedge (one of them may be right):
    reason "conflicting_boxes", judged wrong. Without it (the default) the last box is the answer.
    """
    section = answer_section(response, think_end, require_think_end)
    if section is None:
        return Extraction(None, "no_think_end")
    boxes = find_boxes(section)
    if not boxes:
        if require_box:
            return Extraction(None, "no_box")
        return Extraction(section[-2000:], "no_box_fallback")  # math-verify takes the last number then
    last = boxes[-1].strip()
    if not last:
        return Extraction(None, "empty_box")
    if reject_conflicting and len({_norm(b) for b in boxes}) > 1:
        return Extraction(last, "conflicting_boxes")
    return Extraction(last, "ok")


def format_ok(response: str, think_start_in_prompt: bool = False) -> bool:
    """Is the reasoning enclosed in exactly one `<think>...</think>` pair at the start of the response?
    (klear.common.chat.format_fault finds none of its faults.)

    With `think_start_in_prompt`, the chat template already opened `<think>` in the prompt.
    """
    return format_fault(response, think_start_in_prompt) is None


def _first_final_answer(text: str) -> int:
    """Where math-verify's `(?i:final answer)` anchor first occurs in `text`, or -1."""
    if text.isascii():  # ASCII case folding is all re.IGNORECASE does here, and lower() is ~10x faster on long text
        return text.lower().find("final answer")
    import re

    found = re.search("(?i:final answer)", text)
    return found.start() if found else -1


def official_window_start(response: str) -> int:
    """Where a tail window of `response` can begin so that math-verify's anchored extraction finds exactly the
    matches it finds in the whole response; 0 when no such start exists (the whole response is read).

    The anchored patterns (math-verify 0.9's priorities 0 and 50) all start with "final answer" or contain
    `\\boxed{` inside a delimiter pair. A prefix without "final answer", `\\boxed` or `$$`, whose last `\\[` is
    closed by `\\]` within it, and which ends with a newline, can neither hold such a match nor be part of
    one (inline delimiters stop at a newline, `$$` and `\\[` content at the next `$$` and `\\]`), and the
    newline leaves every lookbehind at the window's first character as it is in the whole response. The window
    must not start with `[`: the `\\s\\[` delimiter would take the newline before it.
    """
    limit = len(response)
    for barrier in ("\\boxed", "$$"):
        found = response.find(barrier)
        if found != -1:
            limit = min(limit, found)
    found = _first_final_answer(response[:limit])
    if found != -1:
        limit = found
    start = response.rfind("\n", 0, limit) + 1
    while start > 0:
        if response.startswith("[", start):
            start = response.rfind("\n", 0, start - 1) + 1
            continue
        bracket = response.rfind("\\[", 0, start)
        if bracket != -1 and response.find("\\]", bracket + 2, start) == -1:  # a display could run into the window
            start = response.rfind("\n", 0, bracket) + 1
            continue
        break
    return start


# --- judging (runs in worker processes) ------------------------------------------------------------
_gold_cache: dict[str, list] = {}


def _parse_gold(gold: str, timeout: int) -> list:
    """Gold answers are parsed once per worker; `$...$` makes math-verify read them as LaTeX."""
    parsed = _gold_cache.get(gold)
    if parsed is None:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

        text = gold.strip()
        boxes = find_boxes(text)
        if boxes:
            text = boxes[-1]
        if not text.startswith("$"):
            text = f"${text}$"
        parsed = parse(text, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                       parsing_timeout=timeout)
        if len(_gold_cache) > 100_000:
            _gold_cache.clear()
        _gold_cache[gold] = parsed
    return parsed


def judge(gold: str, answer: str, boxed: bool, timeout: int) -> bool:
    """math-verify's verdict on one extracted answer against one gold answer."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold_parsed = _parse_gold(gold, timeout)
    text = f"\\boxed{{{answer}}}" if boxed else answer
    pred = parse(text, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                 parsing_timeout=timeout)
    if not gold_parsed or not pred:
        return _norm(gold) == _norm(answer) if boxed else False
    return bool(verify(gold_parsed, pred, timeout_seconds=timeout))


_official_gold_cache: dict[str, list] = {}
_ANCHORED_PRIORITY = 50  # math-verify's "final answer ... I hope" (0), "final answer ... is" and \boxed (50)
_anchored_regexes: list | None = None


def _parse_anchored(window: str, timeout: int) -> list:
    """math-verify's extraction with only its anchored patterns, under its own timeout; [] if it raised."""
    global _anchored_regexes
    from math_verify import ExprExtractionConfig, LatexExtractionConfig
    from math_verify.errors import TimeoutException
    from math_verify.parser import extract_target_from_pred, get_extraction_regexes
    from math_verify.utils import timeout as with_timeout

    if _anchored_regexes is None:  # parse()'s default targets, priority groups after 50 left out
        _anchored_regexes = [([(regex, priority) for regex, priority in regexes if priority <= _ANCHORED_PRIORITY], target)
                             for regexes, target in get_extraction_regexes([LatexExtractionConfig(), ExprExtractionConfig()])]
    try:
        return with_timeout(timeout)(extract_target_from_pred)(window, _anchored_regexes, fallback_mode="first_match",
                                                                extraction_mode="any_match")
    except (Exception, TimeoutException):  # noqa: BLE001 - the caller then parses the whole response, as parse() would
        return []


def parse_official(response: str, timeout: int) -> list:
    """math-verify's `parse(response)`, reading only a tail window where that gives the same result.

    math-verify tries its pattern groups in priority order and stops at the first that extracts; its regexes
    over a whole 30,000-character response cost ~5 ms. From `official_window_start` on, the anchored groups
    (0 and 50: "final answer", `\\boxed`) match in the window exactly as in the whole response, so when they
    extract (an answer and its string) the later groups are never tried and the result is the whole response's.
    Otherwise (no box, only an answer without a match, a barrier early on) the whole response is parsed.
    """
    from math_verify import parse

    start = official_window_start(response)
    if start > 0:
        pred = _parse_anchored(response[start:], timeout)
        if len(pred) == 2:  # an extraction and its string: math-verify stopped in an anchored group
            return pred
    return parse(response, parsing_timeout=timeout)


def judge_official(gold: str, response: str, timeout: int) -> tuple[bool, str | None]:
    """The released judge_math.py's verdict on a whole response: math-verify parses all of it (the thought too;
    its extraction takes the last \\boxed{} anywhere, else the last number), a string match with the gold first,
    then math-verify's equivalence (parse_official: the whole response's parse, from a tail window where it can).
    Returns (correct, the answer math-verify extracted or None)."""
    from math_verify import parse, verify

    pred = parse_official(response, timeout)
    if len(pred) < 2:  # nothing extracted
        return False, None
    extracted, gold = str(pred[1]), gold.strip()
    if extracted == gold:
        return True, extracted
    gold_parsed = _official_gold_cache.get(gold)
    if gold_parsed is None:  # parsed once per worker, as _parse_gold
        gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
        if len(_official_gold_cache) > 100_000:
            _official_gold_cache.clear()
        _official_gold_cache[gold] = gold_parsed
    return bool(verify(gold_parsed, pred, timeout_seconds=timeout)), extracted


# --- the pool ------------------------------------------------------------------------------------------
@dataclass
class MathResult:
    correct: bool
    extracted: str | None
    reason: str  # extraction reason, or: correct, wrong, timeout, error
    format_ok: bool

    def to_dict(self) -> dict:
        return asdict(self)


class MathVerifier:
    """Batch math verification on a pool of worker processes; every item ends within its budget."""

    def __init__(self, config: VerifierConfig | None = None):
        self.config = config or VerifierConfig()
        # Workers start on the first batch; 0 workers means one per core of the container's CPU limit.
        self._pool = WorkerPool("klear.verifiers._math_worker", resolve_workers(self.config.math_workers),
                                setup=self.config.math_timeout_s, item_timeout_s=self.config.math_item_timeout_s,
                                start_timeout_s=START_TIMEOUT_S, name="math verification worker")

    def verify(self, response: str, gold: str) -> MathResult:
        return self.verify_batch([(response, gold)])[0]

    def verify_batch(self, items: list[tuple[str, str]]) -> list[MathResult]:
        """Judge (response, gold) pairs; results in the same order."""
        c = self.config
        results: list[MathResult] = []
        todo: list[tuple[str, str, bool | None]] = []  # (gold, answer, boxed) for the workers to judge
        judged: list[MathResult] = []
        for response, gold in items:
            if c.math_mode == "official":  # the whole response; math-verify extracts (boxed None tells the worker)
                results.append(MathResult(False, None, "official", format_ok(response)))
                todo.append((gold, response, None))
                judged.append(results[-1])
                continue
            ext = extract_answer(response, c.think_end, c.require_think_end, c.require_box, c.reject_conflicting_boxes)
            result = MathResult(False, ext.answer, ext.reason, format_ok(response))
            results.append(result)
            if ext.answer is not None and ext.reason != "conflicting_boxes":
                todo.append((gold, ext.answer, ext.reason == "ok"))
                judged.append(result)
        for result, reply in zip(judged, self._pool.run(todo)):
            if reply.ok:
                verdict = reply.value
                if isinstance(verdict, (list, tuple)):  # official: (verdict, what math-verify extracted)
                    verdict, result.extracted = verdict
                result.correct, result.reason = bool(verdict), "correct" if verdict else "wrong"
            else:  # a stalled judgement was killed (timeout), or math-verify raised (error): wrong either way
                result.correct, result.reason = False, reply.status
        return results

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
