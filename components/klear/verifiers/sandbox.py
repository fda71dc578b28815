"""Run untrusted Python programs in locked-down processes, without user namespaces.

A `SandboxPool` holds one zygote per worker slot (see `_zygote.py` for what each child gets: rlimits,
per-slot uid, Landlock, seccomp, process-group kill, output cap). The pool is thread-safe: callers
submit from any number of threads, each job takes a free slot. If a zygote stops answering within a
job's budget plus a margin, it is killed and restarted, so every call returns in bounded time. Zygotes, and
so the programs they run, die with the process that started the pool, however it ends.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import select
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from klear.common.parallel import resolve_workers
from klear.common.workers import spawn
from klear.verifiers.config import VerifierConfig
from klear.verifiers.slot_uids import UidClaim

__all__ = ["RunResult", "SandboxPool", "SandboxUnavailable", "kernel_support", "package_trees"]

log = logging.getLogger(__name__)

ZYGOTE = Path(__file__).with_name("_zygote.py")
MIN_LANDLOCK_ABI = 6  # 4: TCP bind/connect rules; 6: signal and abstract-socket scoping
EXIT_MEMORY = 3
EXIT_SETUP = 4
_REPLY_MARGIN_S = 5.0  # the zygote answers within the job's timeout plus its own cleanup


class SandboxUnavailable(RuntimeError):
    """The kernel lacks what the sandbox needs, and no opt-out was given."""


@dataclass
class RunResult:
    """What happened to one program run; `status` is a verdict before comparing output."""

    status: str  # ok, runtime_error, timeout, memory_limit, output_limit, sandbox_error
    stdout: bytes = b""
    stderr: bytes = b""
    result: bytes = b""  # functional mode: the returned value (strict: JSON; official, runner, release: _zygote.encode_value)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    maxrss_kb: int = 0
    exit_code: int | None = None
    signal: int | None = None
    workdir: str = ""
    detail: str = field(default="", repr=False)


def kernel_support() -> dict:
    """Which confinement the running kernel and environment offer."""
    from klear.verifiers._zygote import landlock_abi

    try:
        import pyseccomp  # noqa: F401

        seccomp_binding = True
    except (ImportError, OSError):
        seccomp_binding = False
    return {
        "landlock_abi": landlock_abi(),
        "seccomp": Path("/proc/sys/kernel/seccomp/actions_avail").exists() and seccomp_binding,
        "root": os.geteuid() == 0,
    }


def classify(raw: dict) -> str:
    """Map how a child ended to a run status (pure)."""
    if raw.get("error"):
        return "sandbox_error"
    if raw["output_exceeded"]:
        return "output_limit"
    if raw.get("stopped"):
        return "ok"  # ended by the harness, which had judged what it needed
    if raw["timed_out"] or raw["signal"] == signal.SIGXCPU:
        return "timeout"
    if raw["signal"] == signal.SIGKILL:
        # Not ours: RLIMIT_CPU's hard limit (CPU time used up), or else the kernel's OOM killer.
        return "timeout" if raw["cpu_s"] >= raw.get("cpu_limit_s", 0) else "memory_limit"
    if raw["signal"] == signal.SIGXFSZ:
        return "output_limit"  # a file grew past RLIMIT_FSIZE
    if raw["exit_code"] == EXIT_MEMORY:
        return "memory_limit"
    if raw["exit_code"] == EXIT_SETUP:
        return "sandbox_error"
    if raw["exit_code"] == 0:
        return "ok"
    return "runtime_error"


def _interpreter_paths() -> tuple[list[str], list[str]]:
    """(stdlib folders the child imports from, every tree it may read)."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", "import sys; print('\\n'.join(sys.path))"],
        capture_output=True, text=True, check=True, env={},
    ).stdout.split()
    stdlib = [p for p in out if p and os.path.exists(p)]
    # Only folders that hold the stdlib: in a virtual environment platstdlib is the venv's lib/pythonX.Y, whose
    # site-packages (every installed package) programs must not read.
    stdlib += [p for p in (sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"))
               if p not in stdlib and os.path.exists(os.path.join(p, "os.py"))]
    shared_libs = [p for p in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(p)]
    libpython = sysconfig.get_config_var("LIBDIR")
    extra = [libpython] if libpython and os.path.isdir(libpython) else []
    return stdlib, list(dict.fromkeys(stdlib + shared_libs + extra))


def package_trees(names: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(top-level entry, its path) of the installed distributions `names` and everything they require (imports,
    dist-info, vendored libraries), and the names not installed. Only these trees become readable to programs."""
    from importlib import metadata

    from packaging.requirements import Requirement

    trees: dict[str, str] = {}
    missing, seen, todo = [], set(), list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name in names:
                missing.append(name)
            continue
        base = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            top = file.parts[0]
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and (base / top).exists():
                trees.setdefault(top, str((base / top).resolve()))
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(trees.items()), sorted(missing)


class _Slot:
    """One zygote process and the pipes to it; used by one job at a time."""

    def __init__(self, index: int, setup: dict):
        self.index = index
        self.setup = setup
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}

    def start(self) -> None:
        # spawn: started from a thread that lives as long as this process, so the zygote's parent-death signal
        # (see _zygote.main) fires when this process ends, not when the calling thread (an executor's) does.
        self.proc = spawn(
            [sys.executable, "-I", "-S", str(ZYGOTE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
            # Nothing of ours reaches the zygote: no AWS keys, tokens, proxies, PYTHON* variables.
            env={"MALLOC_ARENA_MAX": "1", "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"},
            close_fds=True, start_new_session=True, cwd=self.setup["workdir_root"],
        )
        self._send({**self.setup, "parent_pid": os.getpid()})  # its environment is scrubbed: no pid there
        reply = self._recv(time.monotonic() + 60)
        if reply is None or not reply.get("ok"):
            error = (reply or {}).get("error", "zygote did not start")
            self.kill()
            raise SandboxUnavailable(f"sandbox refused to start: {error}")
        self.info = reply

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        """The running zygote's stdin and stdout (start() opened both)."""
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    def _send(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        stdin, _ = self._pipes()
        stdin.write(struct.pack(">I", len(data)) + data)
        stdin.flush()

    def _read_exact(self, size: int, deadline: float) -> bytes | None:
        fd = self._pipes()[1].fileno()
        chunks, got = [], 0
        while got < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, size - got)
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _recv(self, deadline: float):
        header = self._read_exact(4, deadline)
        if header is None:
            return None
        body = self._read_exact(struct.unpack(">I", header)[0], deadline)
        return None if body is None else pickle.loads(body)

    def run(self, job: dict, stop_when: Callable[[bytes], bool] | None = None) -> dict:
        """The zygote's reply to `job`. `stop_when`: called with each batch of complete result lines as the program
        writes them (job["report_lines"]); once it returns True the zygote is told to end the program."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        try:
            self._send(job)
            deadline = time.monotonic() + job["budget_s"] + _REPLY_MARGIN_S
            reply = self._recv(deadline)
            stopping = False
            while reply is not None and "lines" in reply:
                if not stopping and stop_when is not None and stop_when(reply["lines"]):
                    self._send({"stop": True})
                    stopping = True
                reply = self._recv(deadline)
        except (BrokenPipeError, OSError) as exc:
            reply = {"error": f"zygote pipe: {exc!r}"}
        except BaseException:
            self.kill()  # mid-job: what the zygote sends next belongs to this job, not the slot's next one
            raise
        if reply is None:
            reply = {"error": "zygote did not answer in time"}
        if "error" in reply:
            log.warning("sandbox slot %d: %s; restarting its zygote", self.index, reply["error"])
            self.kill()
        return reply

    def kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self.proc = None

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self._pipes()[0].close()  # EOF: the zygote exits after its current job
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class SandboxPool:
    """Run programs concurrently, one per slot; every call returns within the job's budget."""

    def __init__(self, config: VerifierConfig | None = None, *, keep_workdir: bool = False,
                 workdir_root: str | None = None):
        self.config = config or VerifierConfig()
        support = kernel_support()
        problems = []
        if support["landlock_abi"] < MIN_LANDLOCK_ABI:
            problems.append(f"Landlock ABI {support['landlock_abi']} (need >= {MIN_LANDLOCK_ABI})")
        if not support["seccomp"]:
            problems.append("no seccomp (kernel or the pyseccomp/libseccomp binding)")
        if problems:
            if not self.config.allow_unconfined:
                raise SandboxUnavailable(
                    "the code sandbox needs " + " and ".join(problems) + "; refusing to run untrusted code. "
                    "For a development machine only, set allow_unconfined=true.")
            log.error("!!! SANDBOX WEAKENED (allow_unconfined): %s. Never use this for untrusted code "
                      "on a machine that matters. !!!", "; ".join(problems))
        workers = resolve_workers(self.config.code_workers)  # 0: the container's CPU limit
        use_uid = os.geteuid() == 0 and self.config.slot_uid_base is not None
        if os.geteuid() == 0 and not use_uid:
            log.warning("sandbox: running programs as root (slot_uid_base unset): only Landlock and seccomp "
                        "confine them, and RLIMIT_NPROC does not apply to root")
        self._own_root = workdir_root is None
        self.workdir_root = workdir_root or tempfile.mkdtemp(prefix="klear-sandbox-")
        os.chmod(self.workdir_root, 0o711)  # slot uids may enter their own job folders, not list them
        stdlib, read_paths = _interpreter_paths()
        # Official, runner and release rules: their environment's packages, read-only, through a per-slot folder of
        # links.
        site_packages: list[tuple[str, str]] = []
        missing: list[str] = []
        if self.config.offers_packages and self.config.official_packages:
            site_packages, missing = package_trees(self.config.official_packages)
            if missing:
                log.warning("sandbox: official_packages not installed here, so not importable: %s", ", ".join(missing))
            read_paths = read_paths + [path for _, path in site_packages]
        self.packages = sorted(set(self.config.official_packages) - set(missing)) if site_packages else []
        try:
            import pyseccomp

            seccomp_dir = str(Path(pyseccomp.__file__).parent)
        except (ImportError, OSError):
            seccomp_dir = ""
        # From slot_uid_base upward, the first uids no other pool on this host holds (see slot_uids); claimed
        # last, so that nothing fails between the claim and the block that closes the pool on failure.
        self._uid_claim = (UidClaim(self.config.slot_uid_base, workers)
                           if use_uid and self.config.slot_uid_base is not None else None)
        self._slots: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._all: list[_Slot] = []
        for i in range(workers):
            setup = {
                "min_landlock_abi": MIN_LANDLOCK_ABI, "allow_unconfined": self.config.allow_unconfined,
                "seccomp_dir": seccomp_dir, "read_paths": read_paths, "stdlib_paths": stdlib,
                "uid": self._uid_claim.uids[i] if self._uid_claim else None,
                "workdir_root": self.workdir_root, "keep_workdir": keep_workdir,
                "site_packages": site_packages, "site_dir": os.path.join(self.workdir_root, f"site-{i}"),
            }
            slot = _Slot(i, setup)
            self._all.append(slot)
        try:
            # Zygotes start in parallel (each imports and preloads the stdlib it serves).
            with ThreadPoolExecutor(len(self._all)) as ex:
                list(ex.map(_Slot.start, self._all))
        except BaseException:
            self.close()
            raise
        for s in self._all:
            self._slots.put(s)
        self.workers = workers
        self.uids = [s.setup["uid"] for s in self._all]
        info = self._all[0].info
        log.info("sandbox: %d slots, Landlock ABI %s, seccomp %s, uids %s", workers, info.get("landlock_abi"),
                 info.get("seccomp"), self.uids if use_uid else "shared")

    def run(self, code: str, stdin: str | bytes = b"", *, fn_name: str | None = None, args: str = "",
            timeout_s: float | None = None, calls: list[str] | None = None,
            stop_when: Callable[[bytes], bool] | None = None) -> RunResult:
        """Run one program. stdin mode feeds `stdin`; functional mode calls Solution().fn_name(*args), its result in
        `result`. `calls` (the args of each test; runner rules, with fn_name): every test in this one process
        sharing one module and Solution, `timeout_s` each; `result` holds a line per test (see
        _zygote._call_runner_shared), and `stop_when` (see _Slot.run) may end the process early. No expected
        output is ever sent here: whatever the program's process holds, it can read, and whatever channel it has,
        it can write, so verdicts are the caller's to compute from what the program produced."""
        c = self.config
        timeout = float(timeout_s or c.timeout_s)
        steps = len(calls) + 1 if calls is not None else 1  # the module's setup, then each test
        job: dict[str, Any] = {
            "calls": calls, "report_lines": stop_when is not None, "budget_s": timeout * steps,
            "cpu_limit_s": (int(timeout) + 1) * steps,
            "rules": c.code_rules,
            "code": code, "stdin": stdin.encode() if isinstance(stdin, str) else stdin,
            "fn_name": fn_name, "args": args, "timeout_s": timeout,
            "memory_mb": c.memory_mb, "output_limit": c.output_limit_bytes, "file_limit": c.file_limit_bytes,
            "nproc": c.nproc, "nofile": c.nofile,
        }
        slot = self._slots.get()
        try:
            raw = slot.run(job, stop_when)
        finally:
            self._slots.put(slot)
        if raw.get("error"):
            return RunResult("sandbox_error", detail=raw["error"])
        return RunResult(
            classify({**raw, "cpu_limit_s": job["cpu_limit_s"]}), raw["stdout"], raw["stderr"], raw["result"],
            raw["wall_s"], raw["cpu_s"],
            raw["maxrss_kb"], raw["exit_code"], raw["signal"], raw["workdir"],
        )

    def close(self) -> None:
        for slot in self._all:
            slot.close()
        if self._uid_claim is not None:  # after the slots: their programs are gone with them
            self._uid_claim.release()
        if self._own_root:
            shutil.rmtree(self.workdir_root, ignore_errors=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
