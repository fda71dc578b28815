"""A pool of subprocess workers with hard per-item wall-clock budgets, and the worker side of its protocol.

Only a process-level kill stops CPU-bound code (a sympy blow-up, a stuck sandbox call); thread and asyncio
timeouts do not. Callers are often multi-threaded with torch loaded, so workers are plain `python -m MODULE`
subprocesses (no fork; spawn would re-import the caller's __main__), each in its own session so that killing
the session's process group on overrun takes the worker's children with it. Workers never see the caller's
secrets (see `scrubbed_env`). A worker dies with the process that started it, even one SIGKILLed while the
worker is stuck in an item, and takes its process group along (see `die_with_parent`, `spawn`).

    # the parent
    with WorkerPool("my_pkg.my_worker", workers=4, setup=payload, item_timeout_s=10) as pool:
        replies = pool.run(items)            # input order; each Reply is ok / error / timeout

    # my_pkg/my_worker.py
    if __name__ == "__main__":
        serve(make_handler)                  # make_handler(payload) -> handler(item) -> value

Protocol over the worker's stdin/stdout (multiprocessing Connection framing): in, the setup payload; out,
("ready", None) or ("error", why). Then per item: in, the item; out, ("ok", value) or ("error", why).
Must stay importable without torch: it imports nothing from klear outside klear.common.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import os
import pickle
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Literal, NoReturn

__all__ = ["Reply", "WorkerPool", "die_with_parent", "scrubbed_env", "serve", "spawn"]

log = logging.getLogger(__name__)

# Environment variables a worker never sees: cloud and hub credentials, tokens, keys, passwords, and proxy
# URLs (which can carry a user:password).
_SECRET_ENV = re.compile(
    r"^(AWS|AZURE|GCP|GOOGLE)_|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|(^|_)KEYS?(_|$)|PROXY", re.IGNORECASE)

_MESSAGE_CHARS = 500  # error texts sent back are cut: a huge exception message must not flood the caller

_PARENT_ENV = "KLEAR_WORKER_PARENT"  # the pid of the process that started a worker, for its death check
_PR_SET_PDEATHSIG, _PR_SET_NAME = 1, 15  # prctl options (linux/prctl.h)


def scrubbed_env(environ: Mapping[str, str], sys_path: Sequence[str]) -> dict[str, str]:
    """A worker's environment: `environ` without secrets, and PYTHONPATH = `sys_path` (so a module importable
    in the caller, such as a test helper, is importable in the worker)."""
    env = {k: v for k, v in environ.items() if not _SECRET_ENV.search(k)}
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else os.getcwd() for p in sys_path)
    return env


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MESSAGE_CHARS]


# --- dying with the parent --------------------------------------------------------------------------------
def _prctl(option: int, arg: int | bytes) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


def _on_parent_death(parent: int, sig: int) -> bool:
    """Ask the kernel for `sig` when this process's parent ends; False when `parent` has already ended (this
    process was re-parented before the request, so no signal would come). Linux only: elsewhere always True."""
    if not sys.platform.startswith("linux"):
        return True
    _prctl(_PR_SET_PDEATHSIG, sig)
    return os.getppid() == parent  # checked after the request: a parent dying after it is signalled


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent`, the process that started it, ends, however it ends (a SIGKILLed stage
    runs no cleanup); now if it has already ended. Call it first thing in the child.

    The kernel sends the signal when the parent's *thread* that started this process ends, not only the whole
    process: start such children from a thread that lives as long as the parent (the main thread, or `spawn`).
    """
    if not _on_parent_death(parent, signal.SIGKILL):
        os.kill(os.getpid(), signal.SIGKILL)


_SpawnJob = tuple[Future[subprocess.Popen[Any]], list[str], dict[str, Any]]
_spawner: tuple[int, queue.SimpleQueue[_SpawnJob]] | None = None  # (pid that started the thread, its job queue)
_spawner_lock = threading.Lock()


def spawn(argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(argv, **popen_kwargs)` started from one thread that lives as long as this process, so
    a child calling `die_with_parent` dies with this process, not with the caller's thread (the caller may be a
    short-lived ThreadPoolExecutor thread while the worker it starts serves later calls from other threads)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # none yet, or a forked copy, whose thread stayed behind
            jobs: queue.SimpleQueue[_SpawnJob] = queue.SimpleQueue()
            threading.Thread(target=_spawn_loop, args=(jobs,), name="klear-worker-spawner", daemon=True).start()
            _spawner = (os.getpid(), jobs)
        jobs = _spawner[1]
    started: Future[subprocess.Popen[Any]] = Future()
    jobs.put((started, list(argv), popen_kwargs))
    return started.result()


def _spawn_loop(jobs: queue.SimpleQueue[_SpawnJob]) -> None:
    while True:
        started, argv, popen_kwargs = jobs.get()
        try:
            started.set_result(subprocess.Popen(argv, **popen_kwargs))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread by result()
            started.set_exception(exc)


def _reset_spawner_lock() -> None:
    global _spawner_lock
    _spawner_lock = threading.Lock()  # a fork while another thread held it would leave the child's copy locked


os.register_at_fork(after_in_child=_reset_spawner_lock)


def _guard_group() -> None:
    """Fork a guard that SIGKILLs this worker's process group as soon as the worker ends, however it ends: a
    worker killed with its parent cannot kill its own children (a scorer's subprocess) the way an overrun does.
    Linux only; the worker must lead its process group."""
    if not sys.platform.startswith("linux"):
        return
    worker, wake = os.getpid(), {signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, wake)  # blocked before the fork: the guard cannot miss the signal
    try:
        if os.fork() == 0:
            _guard(worker, wake)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, wake)


def _guard(worker: int, wake: set[signal.Signals]) -> NoReturn:
    try:
        os.closerange(0, 1 << 16)  # holds none of the worker's pipes open: the pool sees the worker's EOF at once
        with contextlib.suppress(OSError):
            _prctl(_PR_SET_NAME, b"klear-guard")  # how ps and top name it (its cmdline is the worker's)
        if _on_parent_death(worker, signal.SIGUSR1):
            signal.sigwait(wake)
        os.killpg(0, signal.SIGKILL)  # the worker's group, the guard included
    finally:
        os._exit(0)  # a guard that could not be set up leaves quietly; it never returns into the worker's code


# --- the worker side --------------------------------------------------------------------------------------
def serve(make_handler: Callable[[Any], Callable[[Any], Any]]) -> None:
    """Run a worker: read the setup payload, build the handler, say ready, then answer items until EOF.

    Call it from the worker module's `if __name__ == "__main__":`, so items are handled on the main thread
    (SIGALRM-based timeouts, such as math-verify's, work only there). A handler exception is an error reply
    and the worker goes on; an exception while building the handler is reported as a start failure. Started by a
    pool, the worker dies with the pool's process and takes its process group (its children) along.
    """
    parent = os.environ.pop(_PARENT_ENV, None)
    if parent is not None:
        die_with_parent(int(parent))
        if os.getpgrp() == os.getpid():  # leads its own group (the pool's start_new_session): the guard may kill it
            _guard_group()
    reader, writer = Connection(os.dup(0), writable=False), Connection(os.dup(1), readable=False)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the handler's children must not hold the item pipe open
    os.close(devnull)
    os.dup2(2, 1)  # stray prints go to stderr: they must not corrupt the protocol
    try:
        handler = make_handler(reader.recv())
    except Exception as exc:  # noqa: BLE001 - reported to the pool, which raises it as a start failure
        writer.send(("error", _describe(exc)))
        return
    writer.send(("ready", None))
    while True:
        try:
            item = reader.recv()
        except EOFError:  # the pool closed: a clean exit lets atexit handlers tidy up
            return
        try:
            # pickled here so that an unpicklable value is an error reply, not a crashed worker
            data = pickle.dumps(("ok", handler(item)))
        except Exception as exc:  # noqa: BLE001 - a failed item, not a failed worker
            data = pickle.dumps(("error", _describe(exc)))
        writer.send_bytes(data)


# --- the pool ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reply:
    """What became of one item: ok (`value` is the handler's result), error or timeout (`message` says why)."""

    status: Literal["ok", "error", "timeout"]
    value: Any = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Worker:
    """One worker process and the pipes to it; `ready` once its handler is built. A replacement (restart) gets the
    same setup payload as the process it replaces."""

    def __init__(self, argv: list[str], env: dict[str, str], setup: Any, start_timeout_s: float):
        self.argv, self.env, self.setup, self.start_timeout_s = argv, env, setup, start_timeout_s
        self.start()

    def start(self) -> None:
        self.proc = spawn(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, close_fds=True,
                          start_new_session=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.conn = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.out = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.ready = False
        self.busy = False  # holds an item: it will not read the EOF of close() before it is done
        self.start_deadline = time.monotonic() + self.start_timeout_s
        with contextlib.suppress(OSError):  # a worker that died at once is reported when its reply is read
            self.out.send(self.setup)

    def exited(self) -> bool:
        """Has the process ended? Looks without reaping it, so its process group id stays reserved for kill()."""
        if self.proc.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def kill(self) -> int:
        """SIGKILL the worker's process group, reap the worker; returns its exit status."""
        if self.proc.returncode is None:  # not reaped yet, so its group id cannot have been reused
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        status = self.proc.wait()
        self.conn.close()
        self.out.close()
        return status

    def restart(self) -> int:
        status = self.kill()
        self.start()
        return status


class WorkerPool:
    """`workers` processes `python -m module` answering items, each within `item_timeout_s` of wall clock.

    `setup` is sent to every worker before its first item: a callable is called with the worker's index
    (0..workers-1) for a per-worker payload, anything else is the payload of all. Workers start on the first
    `run()`, which returns when every one is ready; one that fails to start, or does not say ready within
    `start_timeout_s`, raises RuntimeError (the pool is closed then, and starts afresh on the next `run()`).

    A worker that overruns an item is killed with its process group and replaced (a timeout reply); one that
    dies during an item is replaced (an error reply); one that died while idle is replaced and the item waits.
    Thread-safe: concurrent `run()` calls take turns. Messages call a worker `name` (default "MODULE worker").
    """

    def __init__(self, module: str, workers: int, setup: Any = None, *, item_timeout_s: float,
                 start_timeout_s: float = 60.0, close_grace_s: float = 5.0, name: str | None = None):
        if workers < 1:
            raise ValueError(f"a worker pool needs at least one worker, not {workers}")
        if item_timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError("item_timeout_s and start_timeout_s must be positive")
        self.module, self.workers, self.setup = module, workers, setup
        self.item_timeout_s, self.start_timeout_s, self.close_grace_s = item_timeout_s, start_timeout_s, close_grace_s
        self.name = name or f"{module} worker"
        self.timeouts = self.errors = 0  # over the pool's life
        self.last_timeouts = self.last_errors = 0  # in the latest run()
        self._procs: list[_Worker] = []
        self._lock = threading.Lock()

    # --- public ---------------------------------------------------------------------------------------
    def run(self, items: Sequence[Any]) -> list[Reply]:
        """Replies to `items`, in the same order."""
        with self._lock:
            try:
                if items and not self._procs:
                    self._start()
                return self._run(items)
            except BaseException:
                self._close()  # no worker is left holding an item whose reply the next run would misread
                raise

    def pids(self) -> list[int]:
        """Process ids of the current workers (none before the first run or after close)."""
        return [w.proc.pid for w in self._procs]

    def close(self) -> None:
        """Ask every worker to stop (EOF), give them `close_grace_s` to clean up, then kill their groups."""
        with self._lock:
            self._close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------------------
    def _payload(self, index: int) -> Any:
        return self.setup(index) if callable(self.setup) else self.setup

    def _start(self) -> None:
        # The environment is read at start: the caller's current one, scrubbed, shared by every replacement.
        env = {**scrubbed_env(os.environ, sys.path), _PARENT_ENV: str(os.getpid())}
        argv = [sys.executable, "-m", self.module]
        for i in range(self.workers):  # one by one: if a start raises, close() still finds those started
            self._procs.append(_Worker(argv, env, self._payload(i), self.start_timeout_s))
        # Wait for all of them, so the first items spread over every worker rather than the quickest to start.
        while starting := [w for w in self._procs if not w.ready]:
            self._check_start_deadlines(starting)
            deadline = min(w.start_deadline for w in starting)
            for conn in wait([w.conn for w in starting], timeout=max(0.0, deadline - time.monotonic())):
                self._on_ready_reply(next(w for w in starting if w.conn is conn))

    def _check_start_deadlines(self, starting: list[_Worker]) -> None:
        if any(w.start_deadline <= time.monotonic() for w in starting):
            raise RuntimeError(f"{self.name} did not start within {self.start_timeout_s:.0f} s "
                               f"(python -m {self.module})")

    def _on_ready_reply(self, w: _Worker) -> None:
        try:
            status, detail = w.conn.recv()
        except (EOFError, OSError):
            status, detail = "exited", f"exit status {w.kill()} (its stderr is above)"
        if status != "ready":
            raise RuntimeError(f"{self.name} failed to start (python -m {self.module}): {detail}")
        w.ready = True

    def _reply(self, w: _Worker) -> Reply:
        """The worker's reply to its item; a worker that died is replaced."""
        try:
            status, value = w.conn.recv()
        except (EOFError, OSError):
            return Reply("error", message=f"{self.name} died (exit status {w.restart()})")
        if status == "ok":
            return Reply("ok", value)
        return Reply("error", message=str(value))

    def _run(self, items: Sequence[Any]) -> list[Reply]:
        replies: list[Reply | None] = [None] * len(items)
        todo = deque(range(len(items)))
        busy: dict[_Worker, tuple[int, float]] = {}  # worker -> (item index, deadline)
        while todo or busy:
            for w in self._procs:
                if todo and w.ready and w not in busy:
                    if w.exited():  # died while idle: replace it, the item waits for a worker
                        w.restart()
                        continue
                    try:
                        w.out.send(items[todo[0]])
                    except OSError:
                        w.restart()
                        continue
                    busy[w] = (todo.popleft(), time.monotonic() + self.item_timeout_s)
                    w.busy = True
            starting = [w for w in self._procs if not w.ready]
            deadlines = [d for _, d in busy.values()] + [w.start_deadline for w in starting]
            by_conn: dict[object, _Worker] = {w.conn: w for w in (*busy, *starting)}
            for conn in wait([w.conn for w in by_conn.values()], timeout=max(0.0, min(deadlines) - time.monotonic())):
                w = by_conn[conn]
                if not w.ready:
                    self._on_ready_reply(w)
                    continue
                i, _ = busy.pop(w)
                w.busy = False
                replies[i] = self._reply(w)
            now = time.monotonic()
            for w, (i, deadline) in list(busy.items()):
                if deadline <= now:  # a stalled item: kill the worker and its children, start a fresh one
                    del busy[w]
                    replies[i] = Reply("timeout", message=f"over the {self.item_timeout_s:g} s budget")
                    w.restart()
            self._check_start_deadlines([w for w in starting if not w.ready])
        self._count(replies)  # type: ignore[arg-type]
        return replies  # type: ignore[return-value]

    def _count(self, replies: list[Reply]) -> None:
        self.last_timeouts = sum(r.status == "timeout" for r in replies)
        self.last_errors = sum(r.status == "error" for r in replies)
        self.timeouts += self.last_timeouts
        self.errors += self.last_errors

    def _close(self) -> None:
        for w in self._procs:
            w.out.close()  # EOF: the worker returns from serve() and runs its atexit handlers
        deadline = time.monotonic() + self.close_grace_s
        for w in self._procs:
            # only an idle, ready worker reads the EOF soon; one starting or busy (a run that raised) is killed now
            while w.ready and not w.busy and not w.exited() and time.monotonic() < deadline:
                time.sleep(0.02)
            w.kill()  # also takes any child it left behind
        self._procs = []


def load_function(spec: str) -> Callable[..., Any]:
    """The function named by "module:function" (a worker's scorer); the error names the spec."""
    module, sep, name = spec.partition(":")
    if not sep:
        raise ValueError(f"scorer {spec!r} is not of the form module:function")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:  # the pool's start-up error then names the scorer
        raise ImportError(f"cannot load scorer {spec!r}: {type(exc).__name__}: {exc}") from exc
