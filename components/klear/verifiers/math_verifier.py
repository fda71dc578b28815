"""Math answer checking: extract the final boxed answer, then judge it with math-verify in worker processes.

math-verify's timeouts use SIGALRM, which works only on a process's main thread, and a pathological
expression can still stall sympy: each worker is a process serving items on its main thread, and the
parent kills (and replaces) a worker that overruns an item's wall-clock budget.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, wait

from klear.common.parallel import resolve_workers
from klear.verifiers.config import VerifierConfig

__all__ = ["Extraction", "MathResult", "MathVerifier", "extract_answer", "find_boxes", "format_ok"]

log = logging.getLogger(__name__)

_BOX_COMMANDS = ("\\boxed", "\\fbox")


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


def answer_section(response: str, think_end: str = "</think>", require_think_end: bool = True) -> str | None:
    """What follows the last `think_end`; None if it is required and absent (e.g. cut at max tokens)."""
    if not think_end:
        return response
    cut = response.rfind(think_end)
    if cut == -1:
        return None if require_think_end else response
    return response[cut + len(think_end) :]


@dataclass(frozen=True)
class Extraction:
    answer: str | None  # what will be judged; None means wrong without judging
    reason: str  # ok, no_think_end, no_box, empty_box, conflicting_boxes, no_box_fallback


def _norm(s: str) -> str:
    return "".join(s.split())


def extract_answer(response: str, think_end: str = "</think>", require_think_end: bool = True,
                   require_box: bool = True) -> Extraction:
    """The final answer to judge: the last box after `think_end`.

    Several boxes with different contents are a hedge (one of them may be right), so they are wrong.
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
    if len({_norm(b) for b in boxes}) > 1:
        return Extraction(last, "conflicting_boxes")
    return Extraction(last, "ok")


def format_ok(response: str, think_start_in_prompt: bool = False) -> bool:
    """Is the reasoning enclosed in exactly one `<think>...</think>` pair at the start of the response?

    With `think_start_in_prompt`, the chat template already opened `<think>` in the prompt.
    """
    text = response.lstrip()
    if think_start_in_prompt:
        text = "<think>" + text
    if not text.startswith("<think>") or text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    return text.index("</think>") > len("<think>")


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


def _worker_main(timeout: int) -> None:
    """Serve items over stdin/stdout on this process's main thread (where SIGALRM works)."""
    logging.disable(logging.WARNING)  # math-verify logs every parse timeout
    reader, writer = Connection(0, writable=False), Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    import math_verify  # noqa: F401 - import before saying ready, so the first item is not charged for it

    writer.send("ready")
    while True:
        try:
            gold, answer, boxed = reader.recv()
        except EOFError:
            return
        try:
            writer.send(("ok", judge(gold, answer, boxed, timeout)))
        except Exception as exc:  # noqa: BLE001 - a parse failure is a wrong answer, not a crash
            writer.send(("error", repr(exc)[:200]))


# --- the pool ------------------------------------------------------------------------------------------
@dataclass
class MathResult:
    correct: bool
    extracted: str | None
    reason: str  # extraction reason, or: correct, wrong, timeout, error
    format_ok: bool

    def to_dict(self) -> dict:
        return asdict(self)


class _Worker:
    """A `python -m klear.verifiers._math_worker` process.

    A plain subprocess rather than multiprocessing: spawn would re-import the caller's __main__, and
    fork is unsafe in a multi-threaded caller (a trainer).
    """

    def __init__(self, timeout: int):
        self.timeout = timeout
        self.failed_starts = 0
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "klear.verifiers._math_worker", str(self.timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
        )
        self.conn = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.out = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.ready = False

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.conn.close()
        self.out.close()

    def restart(self) -> None:
        self.stop()
        self.start()


class MathVerifier:
    """Batch math verification on a pool of worker processes; every item ends within its budget."""

    def __init__(self, config: VerifierConfig | None = None):
        self.config = config or VerifierConfig()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    def _ensure_workers(self) -> None:
        if not self._workers:
            n = resolve_workers(self.config.math_workers)  # 0: the container's CPU limit
            self._workers = [_Worker(self.config.math_timeout_s) for _ in range(n)]

    def verify(self, response: str, gold: str) -> MathResult:
        return self.verify_batch([(response, gold)])[0]

    def verify_batch(self, items: list[tuple[str, str]]) -> list[MathResult]:
        """Judge (response, gold) pairs; results in the same order."""
        c = self.config
        results: list[MathResult | None] = [None] * len(items)
        todo: deque[tuple[int, str, str, bool]] = deque()
        for i, (response, gold) in enumerate(items):
            ext = extract_answer(response, c.think_end, c.require_think_end, c.require_box)
            fmt = format_ok(response)
            if ext.answer is None or ext.reason == "conflicting_boxes":
                results[i] = MathResult(False, ext.answer, ext.reason, fmt)
            else:
                results[i] = MathResult(False, ext.answer, ext.reason, fmt)  # filled in below
                todo.append((i, gold, ext.answer, ext.reason == "ok"))
        if todo:
            with self._lock:
                self._run(todo, results)
        return results  # type: ignore[return-value]

    def _run(self, todo: deque, results: list) -> None:
        self._ensure_workers()
        budget = self.config.math_item_timeout_s
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        waiting = {w.conn: w for w in self._workers if not w.ready}
        idle = [w for w in self._workers if w.ready]
        while todo or busy:
            while idle and todo:
                w = idle.pop()
                i, gold, answer, boxed = todo.popleft()
                try:
                    w.out.send((gold, answer, boxed))
                except (BrokenPipeError, OSError):
                    todo.appendleft((i, gold, answer, boxed))
                    w.restart()
                    waiting[w.conn] = w
                    continue
                busy[w.conn] = (w, i, time.monotonic() + budget)
            now = time.monotonic()
            next_deadline = min((d for _, _, d in busy.values()), default=now + 60)
            for conn in wait(list(busy) + list(waiting), timeout=max(0.0, next_deadline - now)):
                if conn in waiting:
                    w = waiting.pop(conn)
                    try:
                        conn.recv()
                        w.ready, w.failed_starts = True, 0
                        idle.append(w)
                    except (EOFError, OSError):
                        w.failed_starts += 1
                        if w.failed_starts >= 3:
                            raise RuntimeError("math verification worker fails to start (is math-verify installed?)")
                        log.warning("math worker died while starting; restarting it")
                        w.restart()
                        waiting[w.conn] = w
                    continue
                w, i, _ = busy.pop(conn)
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    status, value = "error", "worker died"
                    w.restart()
                    waiting[w.conn] = w
                else:
                    idle.append(w)
                r = results[i]
                if status == "ok":
                    r.correct, r.reason = value, "correct" if value else "wrong"
                else:
                    r.correct, r.reason = False, "error"
            now = time.monotonic()
            for conn, (w, i, deadline) in list(busy.items()):
                if deadline <= now:  # a stalled judgement: kill the worker, the item is wrong
                    del busy[conn]
                    results[i].correct, results[i].reason = False, "timeout"
                    w.restart()
                    waiting[w.conn] = w

    def close(self) -> None:
        for w in self._workers:
            w.stop()
        self._workers = []

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
