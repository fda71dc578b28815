"""Process checks the worker and reward tests share, and a server on loopback for the endpoint tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def descendants(pid: int) -> list[int]:
    """The live processes under `pid`: its children, their children and so on (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended while we looked
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return [p for p in found if alive(p)]


def gone_soon(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def left_after_kill(process: subprocess.Popen, tree: list[int], within_s: float = 5.0) -> list[int]:
    """SIGKILL `process` (as a pod or a workstation run dies); the pids of `tree` still running `within_s` later."""
    process.kill()
    process.wait()
    deadline = time.monotonic() + within_s
    return [pid for pid in tree if not gone_soon(pid, max(0.0, deadline - time.monotonic()))]


def kill_tree(process: subprocess.Popen, tree: list[int]) -> None:
    """Clean up after a test: `process` and whatever of `tree` a failure left running."""
    process.kill()
    process.wait()
    for pid in filter(alive, tree):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def served_on_loopback(command: list[str], env: dict[str, str] | None, log: Path, port: int, what: str,
                       timeout_s: float, api_path: str = "/v1") -> Iterator[str]:
    """Start a server (its own process group, output to `log`), wait until its /health answers 200, yield its
    base URL (…/v1 for an OpenAI-compatible one); stop the whole group afterwards. Fails the test, with the log's
    tail, when the server exits or does not answer in `timeout_s`."""
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what} did not come up:\n{log.read_text()[-4000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}{api_path}"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def kill_once_parts_are_up(process: subprocess.Popen, out: str, parts: Callable[[str], list[str]], count: int,
                           deadline: float) -> None:
    """SIGKILL `process` once the output `out` holds at least `count` of its `parts(out)` and no manifest: a merge
    under way, killed between two uploads."""
    from klear.common import storage

    while process.poll() is None and time.monotonic() < deadline:
        if len(parts(out)) >= count and not storage.exists(storage.Uri.parse(out).join(storage.MANIFEST_NAME)):
            process.send_signal(signal.SIGKILL)
            process.wait()
            return
        time.sleep(0.005)
    raise AssertionError(f"the merge ended (exit {process.poll()}) before {count} parts were up: "
                         f"{process.communicate()[1][-2000:]}")
