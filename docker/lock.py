"""Lock files of the images: one exact, complete package set per image, resolved for the image's Python and platform.

    python docker/lock.py lock  [IMAGE...]   # make lock: resolve docker/locks/IMAGE.in into IMAGE.txt
    python docker/lock.py check [IMAGE...]   # make check-images: re-resolve IMAGE.in against IMAGE.txt

Both run `uv pip compile` (uv from the venv, PyPI only, no interpreter download): resolution only, no wheel is
installed, so a conflict such as vLLM 0.31's numpy < 2.4 against a numpy 2.4 pin fails here in seconds instead of
in a multi-GB image build. `check` fails when the inputs no longer resolve with the locked pins, or when the lock
has a package too many or too few (an extra changed in pyproject.toml without `make lock`).

The dev pins (constraints.txt) are the preferred versions of every image, so the CPU image ships what CI tests;
an image lists the packages where it must differ (the GPU image: numpy for vLLM, torch's CUDA build).

Not a package: `docker/` would shadow the `docker` distribution kfp.local imports. Tests load it by path.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "docker" / "locks"
DEV_PINS = ROOT / "constraints.txt"
PROJECT = "klear-pipeline"  # installed from the source tree with --no-deps: never in a lock


@dataclass(frozen=True)
class Image:
    name: str
    dockerfile: str
    python: str  # the interpreter of the base image
    platform: str  # uv's target: architecture and the base image's glibc
    differs_from_dev: tuple[str, ...] = ()  # dev pins this image must not take

    @property
    def source(self) -> Path:
        return LOCKS / f"{self.name}.in"

    @property
    def lock(self) -> Path:
        return LOCKS / f"{self.name}.txt"

    @property
    def target(self) -> str:
        return f"python {self.python}, {self.platform}"


IMAGES = {
    # python:3.11-slim-bookworm: Debian 12, glibc 2.36; the same Python as the dev venv and CI.
    "cpu": Image("cpu", "docker/cpu.Dockerfile", "3.11", "x86_64-manylinux_2_36"),
    # nvidia/cuda:13.0.1-devel-ubuntu24.04: Ubuntu's python3 is 3.12, glibc 2.39. numpy: vLLM 0.31 needs < 2.4 on
    # Python <= 3.12; torch: the dev pin is the CPU build (+cpu), the image takes PyPI's CUDA 13 build.
    "gpu": Image("gpu", "docker/gpu.Dockerfile", "3.12", "x86_64-manylinux_2_39", ("numpy", "torch")),
}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> dict[str, str]:
    """name -> version of every `name==version` line (comments and `# via` annotations skipped)."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        if match := _PIN.match(line.strip()):
            pins[canonical(match.group(1))] = match.group(2)
    return pins


def parse_lock(path: Path) -> dict[str, tuple[str, set[str]]]:
    """name -> (version, packages it is required by) from uv's annotated output."""
    entries: dict[str, tuple[str, set[str]]] = {}
    current: str | None = None
    for line in path.read_text().splitlines():
        if match := _PIN.match(line):
            current = canonical(match.group(1))
            entries[current] = (match.group(2), set())
        elif current and (via := re.match(r"^\s+#\s+(?:via\s+)?([A-Za-z0-9][A-Za-z0-9._\-\[\]]*)\s*$", line)):
            entries[current][1].add(canonical(via.group(1).split("[")[0]))
    return entries


def _uv() -> str:
    from uv import find_uv_bin  # the `uv` distribution from the test extra, pinned in constraints.txt

    return find_uv_bin()


def _compile(image: Image, constraints: Path, extra: list[str]) -> subprocess.CompletedProcess[str]:
    command = [_uv(), "pip", "compile", str(image.source.relative_to(ROOT)), "--constraint", str(constraints),
               "--python-version", image.python, "--python-platform", image.platform,
               "--no-emit-package", PROJECT, "--no-config", *extra]
    # No interpreter download: sdists whose metadata needs a build (DeepSpeed) are built with the venv's Python.
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)


def _dev_pins(image: Image, folder: Path) -> Path:
    lines = [line for line in DEV_PINS.read_text().splitlines()
             if canonical(line.split("==")[0]) not in image.differs_from_dev]
    path = folder / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def lock(image: Image) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pins = _dev_pins(image, Path(tmp))
        result = _compile(image, pins, ["--custom-compile-command", "make lock"])
    if result.returncode != 0:
        raise SystemExit(f"{image.name}: no lock ({image.target}):\n{result.stderr}")
    # The temporary file's path would make every run differ: name what it holds instead.
    label = "constraints.txt" + (f" (less {', '.join(image.differs_from_dev)})" if image.differs_from_dev else "")
    body = result.stdout.replace(str(pins), label)
    header = f"# image: {image.dockerfile}; target: {image.target}\n"
    image.lock.write_text(header + body)
    print(f"{image.lock.relative_to(ROOT)}: {len(parse_pins(body))} packages for {image.target}")


def check(image: Image) -> list[str]:
    """Problems of one image's lock; [] when its inputs resolve to exactly the locked set."""
    if not image.lock.exists():
        return [f"{image.name}: {image.lock.relative_to(ROOT)} is missing (make lock)"]
    result = _compile(image, image.lock, ["--no-header", "--no-annotate"])
    if result.returncode != 0:
        return [f"{image.name}: {image.source.name} does not resolve with {image.lock.name} for {image.target}:\n"
                f"{result.stderr.strip()}"]
    resolved, locked = parse_pins(result.stdout), parse_pins(image.lock.read_text())
    problems = [f"{image.name}: {name}=={resolved[name]} is needed but not locked (make lock)"
                for name in sorted(set(resolved) - set(locked))]
    problems += [f"{image.name}: {name}=={locked[name]} is locked but no longer needed (make lock)"
                 for name in sorted(set(locked) - set(resolved))]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["lock", "check"])
    parser.add_argument("images", nargs="*", metavar="IMAGE", help=f"one of {sorted(IMAGES)}; default: all")
    args = parser.parse_args(argv)
    if unknown := set(args.images) - set(IMAGES):
        parser.error(f"unknown image(s) {sorted(unknown)}; known: {sorted(IMAGES)}")
    images = [IMAGES[name] for name in (args.images or IMAGES)]
    if args.action == "lock":
        for image in images:
            lock(image)
        return 0
    problems = [problem for image in images for problem in check(image)]
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print("resolved: " + "; ".join(f"{i.name} ({i.target}, {len(parse_pins(i.lock.read_text()))} packages)"
                                       for i in images))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
