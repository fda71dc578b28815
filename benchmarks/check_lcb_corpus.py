"""Check the LiveCodeBench parity corpus's runner verdicts against lcb_runner itself.

    python benchmarks/check_lcb_corpus.py --lcb-root DIR [--slow]

DIR is a LiveCodeBench checkout (its `lcb_runner/evaluation/testing_util.py` is imported from there, not
copied). Every case of tests/verifiers/test_lcb_parity.py runs through the runner's `run_test` in a fresh
process (it disables parts of `os` and installs an alarm), with stdin /dev/null as in a batch run; the verdict
is printed beside the corpus's runner column, and the exit status is the number of disagreements.
`--slow`: also the timeout cases (6 s each).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from lcb_runner.evaluation.testing_util import run_test
case = json.loads(sys.argv[2])
results, _ = run_test(case["sample"], test=case["code"], timeout=6)
print("RESULT " + json.dumps([bool(r) if not isinstance(r, int) or isinstance(r, bool) else r for r in results]))
"""
# run_test's codes: True passed, False wrong (call-based), -2 wrong, -3 timeout, -4 runtime error, -1 compile
VERDICTS = {-1: "runtime_error", -2: "wrong_answer", -3: "timeout", -4: "runtime_error"}


def verdict_of(results: list[bool | int]) -> str:
    """The corpus's verdict for run_test's result list: passed, or the first failing test's."""
    failing = next((r for r in results if r is not True), None)
    if failing is None:
        return "passed"
    return "wrong_answer" if failing is False else VERDICTS.get(int(failing), f"code {failing}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lcb-root", required=True, type=Path, help="a LiveCodeBench checkout")
    parser.add_argument("--slow", action="store_true", help="also run the timeout cases")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("corpus", ROOT / "tests/verifiers/test_lcb_parity.py")
    assert spec is not None and spec.loader is not None
    corpus = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "components"))
    spec.loader.exec_module(corpus)
    disagreements = 0
    for name, program, tests, fn_name, _strict, _official, runner, _reason in corpus.CASES:
        if runner == "timeout" and not args.slow:
            print(f"{name:28s} skipped (timeout case; --slow runs it)")
            continue
        io = {"inputs": [t["input"] for t in tests], "outputs": [t["output"] for t in tests],
              **({"fn_name": fn_name} if fn_name else {})}
        case = json.dumps({"sample": {"input_output": json.dumps(io)}, "code": program})
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.lcb_root.resolve()), case], capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        got = verdict_of(json.loads(line[len("RESULT "):])) if line else "crashed: " + done.stderr.strip()[-200:]
        disagreements += got != runner
        print(f"{name:28s} {got:14s}" + ("" if got == runner else f" corpus: {runner}"))
    print(f"{disagreements} disagreement(s)")
    return disagreements


if __name__ == "__main__":
    sys.exit(min(main(), 100))
