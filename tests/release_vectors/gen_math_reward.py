"""Vectors of the release's math reward and format penalties: math_dapo.compute_score as its RL data calls it
(data_source math_longcot_math_verify: is_longcot=True, is_use_math_verify=True), through the math-verify installed
beside the generator (recorded: the release pins 0.7.0; benchmarks/math_verify_versions.py measures the flips)."""

from __future__ import annotations

import importlib
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from tests.release_vectors.release import HEAD, package, provenance

FILES = ["verl/utils/reward_score/math_dapo.py", "verl/utils/reward_score/reward_config.py"]
THOUGHT = "<think>\nAdd 40 and 2: that is 42.\n</think>\n\n"
# (name, response, gold)
CASES = [
    ("right", THOUGHT + "The answer is $\\boxed{42}$.", "42"),
    ("wrong", THOUGHT + "The answer is $\\boxed{41}$.", "42"),
    ("right, no box: the last number", THOUGHT + "The answer is 42.", "42"),
    ("right only inside the thought", "<think>\nso \\boxed{42}\n</think>\n\nDone.", "42"),
    ("two boxes, the last right", THOUGHT + "First $\\boxed{41}$, finally $\\boxed{42}$.", "42"),
    ("fraction", THOUGHT + "So $\\boxed{\\frac{1}{2}}$.", "0.5"),
    ("missing </think>, right", "<think>\nAdd them: \\boxed{42}", "42"),
    ("missing </think>, wrong", "<think>\nAdd them: \\boxed{41}", "42"),
    ("missing <think>, right", "Add them.\n</think>\n\n$\\boxed{42}$", "42"),
    ("no tags at all, right", "Add them: the answer is $\\boxed{42}$.", "42"),
    ("no tags at all, wrong", "Add them: the answer is $\\boxed{41}$.", "42"),
    ("empty response", "", "42"),
    ("tags reversed", "</think>\nAdd them.\n<think>\n$\\boxed{42}$", "42"),
    ("two thoughts, answer after the last", "<think>\na\n</think>\n<think>\nb\n</think>\n$\\boxed{42}$", "42"),
]


def generate(git_dir: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        package(git_dir, HEAD, FILES, Path(tmp))
        math_dapo = importlib.import_module("verl.utils.reward_score.math_dapo")
        cases = [{"name": name, "response": response, "answer": gold,
                  "reward": float(math_dapo.compute_score(response, gold, is_longcot=True, is_use_math_verify=True))}
                 for name, response, gold in CASES]
    return {"provenance": [provenance(git_dir, HEAD, FILES[0], "compute_score(is_longcot=True, is_use_math_verify=True)",
                                      math_verify=metadata.version("math-verify"))],
            "cases": cases}
