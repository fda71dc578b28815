"""The images (docker/): every package comes from the image's lock, the locks pin exact versions that satisfy the
package's own requirements, the GPU lock fits vLLM (numpy < 2.4) and the base image's CUDA, images run as a
non-root user, and the build context leaves the checkout's venv and caches out. All offline but the last test,
which re-resolves the locks against PyPI (what `make check-images` runs)."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.deploy.helpers import ROOT, dockerfile, dockerignore_rules, dockerignored, load_lock_module, pip_installs

lock = load_lock_module()
IMAGES = sorted(lock.IMAGES)
# The base images' interpreters: what `make lock` must resolve for.
BASE_PYTHON = {r"^python:(\d+\.\d+)[.-]": None, r"^nvidia/cuda:[\d.]+-\w+(?:-\w+)*-ubuntu24\.04$": "3.12"}


def _dockerfile(name: str) -> list:
    return dockerfile(ROOT / lock.IMAGES[name].dockerfile)


def _base(name: str) -> str:
    return next(i.args for i in _dockerfile(name) if i.keyword == "FROM").split()[0]


def _lock_path(name: str) -> str:
    return lock.IMAGES[name].lock.relative_to(ROOT).as_posix()


# --------------------------------------------------------------------------- Dockerfiles


@pytest.mark.parametrize("name", IMAGES)
def test_every_pip_install_takes_the_lock(name: str) -> None:
    instructions = _dockerfile(name)
    installs = pip_installs(instructions)
    assert len(installs) >= 2, "the locked set, then the project"
    lock_file = _lock_path(name)
    for ins, argv in installs:
        assert "--no-deps" in argv, f"line {ins.line}: pip resolves on its own: {' '.join(argv)}"
        pairs = {(a, b) for a, b in zip(argv, argv[1:])}
        assert pairs & {("-r", lock_file), ("-c", lock_file)}, f"line {ins.line}: {' '.join(argv)} ignores {lock_file}"
    assert ("-r", lock_file) in {(a, b) for _, argv in installs for a, b in zip(argv, argv[1:])}
    # PIP_CONSTRAINT holds pip's isolated build environments (sdists) and any later pip to the same pins.
    first_install = installs[0][0].line
    constraint = [i for i in instructions if i.keyword == "ENV" and "PIP_CONSTRAINT=" in i.args and i.line < first_install]
    assert constraint and constraint[-1].args.split("PIP_CONSTRAINT=")[1].split()[0] == f"/opt/klear/{lock_file}"


@pytest.mark.parametrize("name", IMAGES)
def test_runs_as_a_non_root_user(name: str) -> None:
    users = [i.args for i in _dockerfile(name) if i.keyword == "USER"]
    assert users, "no USER: the image runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: numeric, so runAsNonRoot can verify it"


@pytest.mark.parametrize("name", IMAGES)
def test_states_the_sandbox_needs(name: str) -> None:
    instructions = _dockerfile(name)
    labels = " ".join(i.args for i in instructions if i.keyword == "LABEL")
    assert re.search(r"io\.klear\.sandbox\.kernel=\"[^\"]*Landlock ABI >= 6[^\"]*seccomp", labels)
    apt = [i.args for i in instructions if i.keyword == "RUN" and "apt-get install" in i.args]
    assert any(re.search(r"\blibseccomp2\b", a) for a in apt), "pyseccomp loads libseccomp at run time"


@pytest.mark.parametrize("name", IMAGES)
def test_bakes_in_the_commit_it_was_built_from(name: str) -> None:
    """KLEAR_GIT_COMMIT (the code version every output's lineage records) comes from a build argument that make
    images sets to the checkout's HEAD; declared after the last RUN, so a new commit rebuilds no layer."""
    instructions = _dockerfile(name)
    arg = next(i for i in instructions if i.keyword == "ARG" and i.args.split("=")[0] == "KLEAR_GIT_COMMIT")
    env = [i for i in instructions if i.keyword == "ENV" and "KLEAR_GIT_COMMIT=$KLEAR_GIT_COMMIT" in i.args.split()]
    assert env and env[0].line > arg.line, "ENV KLEAR_GIT_COMMIT=$KLEAR_GIT_COMMIT after its ARG"
    assert arg.line > max(i.line for i in instructions if i.keyword == "RUN")
    dockerfile_path = lock.IMAGES[name].dockerfile
    build = next(line for line in (ROOT / "Makefile").read_text().replace("\\\n", " ").splitlines()
                 if f"docker build -f {dockerfile_path}" in line)
    assert "--build-arg KLEAR_GIT_COMMIT=$(KLEAR_GIT_COMMIT)" in build, build
    assert re.search(r"^KLEAR_GIT_COMMIT \?= \$\(shell git rev-parse HEAD", (ROOT / "Makefile").read_text(), re.M)


@pytest.mark.parametrize("name", IMAGES)
def test_lock_targets_the_base_image(name: str) -> None:
    image, base = lock.IMAGES[name], _base(name)
    pythons = [(m.group(1) if m.groups() else fixed) for pattern, fixed in BASE_PYTHON.items()
               if (m := re.match(pattern, base))]
    assert pythons == [image.python], f"{base}: Python {pythons}, lock resolves for {image.python}"
    header = image.lock.read_text().splitlines()[0]
    assert header == f"# image: {image.dockerfile}; target: {image.target}", "stale lock: make lock"


# --------------------------------------------------------------------------- locks


@pytest.mark.parametrize("name", IMAGES)
def test_lock_pins_every_line_exactly(name: str) -> None:
    bad = []
    for number, line in enumerate(lock.IMAGES[name].lock.read_text().splitlines(), 1):
        text = line.strip()
        if text and not text.startswith("#") and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][\w.+!-]*", text):
            bad.append(f"{number}: {line}")
    assert not bad, "not an exact pin:\n" + "\n".join(bad)
    assert len(lock.parse_pins(lock.IMAGES[name].lock.read_text())) > 50


def test_gpu_lock_fits_vllm_and_the_cuda_base() -> None:
    entries = lock.parse_lock(lock.IMAGES["gpu"].lock)
    assert Version(entries["numpy"][0]) < Version("2.4"), "vLLM 0.31 (mistral_common[image]) needs numpy < 2.4"
    assert entries["vllm"][0] == "0.31.0" and entries["torch"][0] == "2.13.0"  # PyPI's CUDA build: no +cpu
    base = re.match(r"^nvidia/cuda:(\d+)\.\d+", _base("gpu"))
    assert base, f"{_base('gpu')}: not an nvidia/cuda base"
    # The CUDA major of torch's own CUDA packages: cuNN-suffixed names, or CUDA 13's unsuffixed ones by version.
    majors = {}
    for name, (version, required_by) in entries.items():
        if "torch" not in required_by:
            continue
        if suffix := re.search(r"-cu(\d+)$", name):
            majors[name] = int(suffix.group(1))
        elif name.startswith(("nvidia-cuda-runtime", "cuda-toolkit")):
            majors[name] = int(version.split(".")[0])
    assert majors, "found none of torch's CUDA packages in the lock"
    assert set(majors.values()) == {int(base.group(1))}, f"base CUDA {base.group(1)}, torch's: {majors}"


def test_cpu_lock_has_no_torch_or_cuda() -> None:
    names = lock.parse_pins(lock.IMAGES["cpu"].lock.read_text())
    assert not [n for n in names if n in ("torch", "triton", "vllm") or n.startswith(("nvidia-", "cuda-"))]


@pytest.mark.parametrize("name", IMAGES)
def test_lock_follows_the_dev_pins(name: str) -> None:
    image = lock.IMAGES[name]
    dev = lock.parse_pins((ROOT / "constraints.txt").read_text())
    locked = lock.parse_pins(image.lock.read_text())
    differ = {n: (dev[n], locked[n]) for n in set(dev) & set(locked) if dev[n] != locked[n]}
    assert set(differ) <= set(image.differs_from_dev), f"constraints.txt changed since the last make lock: {differ}"


def _extras_closure(pyproject: dict, extras: set[str]) -> list[Requirement]:
    """The project's base requirements plus those of `extras`, following self-references (gppo -> sft, verify)."""
    name = pyproject["project"]["name"]
    optional = pyproject["project"]["optional-dependencies"]
    out = [Requirement(r) for r in pyproject["project"]["dependencies"]]
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            req = Requirement(text)
            if req.name == name:
                pending.extend(req.extras)
            else:
                out.append(req)
    return out


@pytest.mark.parametrize("name", IMAGES)
def test_lock_satisfies_the_package(name: str) -> None:
    """What pip check does in the image build, offline: each requirement of the installed extras holds in the lock
    (e.g. pyproject pinning numpy==2.4.6 again would break the GPU image)."""
    image = lock.IMAGES[name]
    extras = re.search(r"^\.\[([\w,\s-]+)\]", image.source.read_text(), re.MULTILINE)
    assert extras, f"{image.source.name} names no extras of the project"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    locked = lock.parse_pins(image.lock.read_text())
    environment = {"python_version": image.python, "python_full_version": f"{image.python}.0",
                   "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                   "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix"}
    broken = []
    for req in _extras_closure(pyproject, {e.strip() for e in extras.group(1).split(",")}):
        if req.marker and not req.marker.evaluate(environment):
            continue
        version = locked.get(lock.canonical(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            broken.append(f"{req} (locked: {version})")
    assert not broken, f"{name} lock does not satisfy pyproject.toml: {broken}"


# --------------------------------------------------------------------------- build context


def test_build_context_leaves_the_checkout_out() -> None:
    rules = dockerignore_rules(ROOT / ".dockerignore")
    for path in (".venv", ".venv/lib/python3.11/site-packages/torch/__init__.py", "runs/demo/out.jsonl", ".git/HEAD",
                 ".cache/uv/x", ".pytest_cache/v", "components/klear/__pycache__/cli.cpython-311.pyc",
                 "pipelines/compiled/klear-reasoner.yaml", "tests/conftest.py", "klear_pipeline.egg-info/PKG-INFO"):
        assert dockerignored(path, rules), f"{path} would be sent to the builder"
    # ... and keeps what the Dockerfiles copy.
    for name in IMAGES:
        for ins in _dockerfile(name):
            if ins.keyword == "COPY":
                source = ins.args.split()[0]
                assert not dockerignored(source, rules), f"{lock.IMAGES[name].dockerfile}: COPY {source} is ignored"
                assert (ROOT / source).exists(), source
    assert not dockerignored("components/klear/cli.py", rules) and not dockerignored("pipelines/compile.py", rules)


def test_dockerignore_matcher() -> None:
    """The matcher the previous test trusts: Docker's last-match-wins with `!` and `**`."""
    assert dockerignored("a/b/c.pyc", ["**/*.pyc"]) and dockerignored(".venv/x", [".venv"])
    assert not dockerignored("docker/locks/cpu.txt", ["*", "!docker/locks/*.txt"])
    assert dockerignored("docker/locks/cpu.in", ["*", "!docker/locks/*.txt"])
    assert not dockerignored("src/a.py", ["src/b.py"])


# --------------------------------------------------------------------------- resolution (PyPI)


def test_locks_resolve_for_their_images() -> None:
    """`make check-images`: each image's inputs resolve with its lock for its Python and platform (uv, metadata
    only, ~5 s with a cold cache)."""
    problems = [p for name in IMAGES for p in lock.check(lock.IMAGES[name])]
    assert not problems, "\n".join(problems)


def test_resolution_check_catches_the_numpy_conflict(tmp_path: Path) -> None:
    """The bug this check exists for: numpy==2.4.6 in pyproject.toml against vLLM 0.31 on Python 3.12."""
    for part in ("pyproject.toml", "constraints.txt", "docker/lock.py", "docker/locks"):
        source, target = ROOT / part, tmp_path / part
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    (tmp_path / "components" / "klear").mkdir(parents=True)
    (tmp_path / "components" / "klear" / "__init__.py").write_text("")
    pyproject = tmp_path / "pyproject.toml"
    text, count = re.subn(r'"numpy[^"]*"', '"numpy==2.4.6"', pyproject.read_text(), count=1)
    assert count == 1
    pyproject.write_text(text)
    module = load_lock_module()  # a fresh copy of docker/lock.py, pointed at the edited tree
    module.ROOT, module.LOCKS = tmp_path, tmp_path / "docker" / "locks"
    problems = module.check(module.IMAGES["gpu"])
    assert problems and "does not resolve" in problems[0] and "numpy" in problems[0], problems
