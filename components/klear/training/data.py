"""Training rows from curate's output: the one rule by which every training stage unwraps them (torch-free).

Curate publishes `id`, `source`, `prompt` and `record`, the source row as JSON. A training stage reads
the row flat: the source row's fields fill in what the outer row lacks, and the outer row wins where
both have a field, since curate's `prompt` is the mapped prompt it deduplicated and decontaminated.
"""

from __future__ import annotations

import json
from typing import Any

RECORD = "record"  # curate's column holding the source row


def flatten_record(row: dict[str, Any]) -> dict[str, Any] | None:
    """The row with its `record` merged in (outer fields win); the row itself when it has no `record`;
    None when `record` is there but is not a JSON object (a row that cannot be read, never guessed at)."""
    inner = row.get(RECORD)
    if inner is None:
        return row
    if isinstance(inner, str):
        try:
            inner = json.loads(inner)
        except ValueError:
            return None
    if not isinstance(inner, dict):
        return None
    return {**inner, **{key: value for key, value in row.items() if key != RECORD}}
