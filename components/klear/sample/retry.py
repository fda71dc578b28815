"""The endpoint client's retry policy, as pure functions: what to retry, and how long to wait."""

from __future__ import annotations

import email.utils
import random
import time
from typing import Literal

Verdict = Literal["ok", "retry", "unit", "fatal"]

# The run cannot succeed with this endpoint, key or model name: stop everything at once, with the server's word.
FATAL_STATUS = frozenset({401, 403, 404, 407})
# A server that is busy, restarting or briefly confused: the same request can succeed later.
RETRY_STATUS = frozenset({408, 409, 425, 429})


def classify_status(status: int) -> Verdict:
    """200 ok; 429/408/409/425 and 5xx retry; 401/403/404/407 stop the run; any other 4xx fails just this unit
    (a prompt too long for the context, a parameter the server refuses: retrying cannot help)."""
    if status == 200:
        return "ok"
    if status in RETRY_STATUS or status >= 500:
        return "retry"
    if status in FATAL_STATUS:
        return "fatal"
    return "unit"


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(attempt: int, initial: float, cap: float, rng: random.Random, retry_after: float | None = None,
                  retry_after_cap: float = 600.0) -> float:
    """Delay before attempt `attempt + 1`. A server's Retry-After wins (capped; up to 10% later, so clients told
    the same second do not return together); else exponential from `initial`, capped, with jitter in its upper
    half (spreads retries, yet never retries sooner than half the nominal delay)."""
    if retry_after is not None:
        wait = min(retry_after, retry_after_cap)
        return wait * (1.0 + 0.1 * rng.random())
    nominal = min(cap, initial * 2.0 ** max(0, attempt - 1))
    return nominal * (0.5 + 0.5 * rng.random())
