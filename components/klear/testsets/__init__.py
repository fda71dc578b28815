"""Public test sets shipped with the pipeline (AIME 2024, AIME 2025, HMMT February 2025).

One JSON object a line: {"id", "benchmark", "problem", "answer"}. They are test sets:
curate removes anything that overlaps them, and nothing may train on them.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent

NAMES = ("aime24", "aime25", "hmmt_feb_2025")


def path(name: str) -> Path:
    """Local path of a shipped benchmark file, by name (see NAMES)."""
    if name not in NAMES:
        raise KeyError(f"unknown benchmark {name!r}; shipped: {', '.join(NAMES)}")
    return _HERE / f"{name}.jsonl"


def all_paths() -> list[Path]:
    return [path(name) for name in NAMES]
