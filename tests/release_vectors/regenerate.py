"""Regenerate the release vectors from a fetched copy of the released code.

    .venv/bin/python -m tests.release_vectors.regenerate --release GIT_DIR [FAMILY ...]

GIT_DIR: a git directory of Kwai-Klear/KlearReasoner holding the commits named in release.py (the `fetch` tool's
/work/.mirror/Kwai-Klear+KlearReasoner/repo, or a clone's .git). FAMILY: schedule, policy_loss, math_reward,
code_reward (default: all). Each family's generator runs the release's own functions and writes
tests/release_vectors/<family>.json with their provenance; the tests compare this project against those files.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

FAMILIES = ("schedule", "policy_loss", "math_reward", "code_reward")
HERE = Path(__file__).parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", type=Path, required=True, help="git directory of Kwai-Klear/KlearReasoner")
    parser.add_argument("families", nargs="*", metavar="FAMILY", help=f"any of {', '.join(FAMILIES)} (default: all)")
    args = parser.parse_args(argv)
    if not (args.release / "HEAD").is_file() and not (args.release / ".git").exists():
        parser.error(f"--release {args.release}: not a git directory")
    unknown = sorted(set(args.families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    for family in args.families or FAMILIES:
        generate = importlib.import_module(f"tests.release_vectors.gen_{family}").generate
        vectors = generate(args.release)
        target = HERE / f"{family}.json"
        target.write_text(json.dumps(vectors, indent=1) + "\n")
        print(f"{target}: {len(vectors.get('cases', vectors.get('lr', [])))} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
