"""Numbers the verifier tests write out: integers past Python's int->str digit limit (4,300 digits)."""

from __future__ import annotations

import sys


def decimal(n: int) -> str:
    """`n` in decimal whatever its size (the digit limit lifted for this one conversion)."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return str(n)
    finally:
        sys.set_int_max_str_digits(old)
