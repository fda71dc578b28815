"""WorkerPool: scrubbed environments, budgets with process-group kills, crashes, start failures, order, workers
dying with a killed parent (real worker processes running tests.common.pool_worker, no mocks)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from klear.common.workers import Reply, WorkerPool, scrubbed_env
from klear.verifiers import MathVerifier, VerifierConfig
from tests.processes import alive, descendants, gone_soon, kill_tree, left_after_kill

WORKER = "tests.common.pool_worker"
BUDGET_S = 1.0
SECRETS = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s", "HF_TOKEN": "t", "WANDB_API_KEY": "k",
           "MY_SECRET": "m", "API_KEY": "k2", "DB_PASSWORD": "p"}
SECRET_NAME = re.compile(r"^AWS_|TOKEN|SECRET|KEY|PASSW", re.IGNORECASE)


def _value(value: object, sleep: float = 0.0) -> dict:
    return {"action": "value", "value": value, "sleep": sleep}


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    with WorkerPool(WORKER, workers=2, setup={}, item_timeout_s=BUDGET_S) as p:
        p.run([_value(0)])  # workers up, so budgets below exclude start-up
        yield p


# --- environment ------------------------------------------------------------------------------------------
def test_scrubbed_env_drops_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    environ = {"PATH": "/usr/bin", "HOME": "/root", "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s",
               "AWS_ENDPOINT_URL": "http://x", "HF_TOKEN": "t", "WANDB_API_KEY": "k", "DB_PASSWORD": "p",
               "https_proxy": "http://u:p@proxy", "GOOGLE_APPLICATION_CREDENTIALS": "/c.json", "HF_HOME": "/hf"}
    env = scrubbed_env(environ, ["", "/repo", "/lib/site-packages"])
    assert sorted(env) == ["HF_HOME", "HOME", "PATH", "PYTHONPATH"]
    assert env["PYTHONPATH"].split(":") == [str(tmp_path), "/repo", "/lib/site-packages"]


def test_worker_sees_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    with WorkerPool(WORKER, workers=1, setup={}, item_timeout_s=10) as p:
        [reply] = p.run([{"action": "env"}])
    assert reply.ok and "PATH" in reply.value and "PYTHONPATH" in reply.value
    assert [name for name in reply.value if SECRET_NAME.search(name)] == []


def _children(marker: bytes) -> list[int]:
    """Live child processes of this one whose command line contains `marker`."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # ended while we looked
        if ppid == os.getpid() and marker in cmdline:
            pids.append(int(stat.parent.name))
    return pids


def test_math_workers_see_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read the environment of a live math verification worker from /proc."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    with MathVerifier(VerifierConfig(math_workers=1)) as verifier:
        assert verifier.verify("<think>x</think> \\boxed{4}", "4").correct
        [pid] = _children(b"klear.verifiers._math_worker")
        names = [entry.split(b"=", 1)[0].decode() for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                 if entry]
    assert "PATH" in names and "PYTHONPATH" in names
    assert [name for name in names if SECRET_NAME.search(name)] == []


# --- budgets, crashes -------------------------------------------------------------------------------------
def test_overrun_kills_the_worker_and_its_children(pool: WorkerPool, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    before = pool.timeouts
    start = time.monotonic()
    [reply] = pool.run([{"action": "hang", "pid_file": str(pid_file)}])
    assert time.monotonic() - start < BUDGET_S + 1.5
    assert reply.status == "timeout" and not reply.ok
    assert (pool.timeouts, pool.last_timeouts, pool.last_errors) == (before + 1, 1, 0)
    worker, child = map(int, pid_file.read_text().split())
    assert gone_soon(worker) and gone_soon(child)
    assert worker not in pool.pids()
    again = pool.run([_value("a"), _value("b")])
    assert [r.value[0] for r in again] == ["a", "b"] and pool.last_timeouts == 0


def test_raising_handler_gives_an_error_reply_and_the_worker_goes_on(pool: WorkerPool) -> None:
    pids = pool.pids()
    failed, fine = pool.run([{"action": "raise"}, _value(1)])
    assert failed == Reply("error", message="ValueError: handler bug")
    assert fine.value[0] == 1
    assert (pool.last_errors, pool.pids()) == (1, pids)  # nobody was replaced


def test_unpicklable_value_is_an_error_reply(pool: WorkerPool) -> None:
    [reply] = pool.run([{"action": "unpicklable"}])
    assert reply.status == "error" and "pickle" in reply.message.lower()


def test_worker_dying_mid_item_gives_an_error_and_is_replaced(pool: WorkerPool) -> None:
    before = pool.errors
    died, *fine = pool.run([{"action": "exit"}, _value(1), _value(2), _value(3)])
    assert died.status == "error" and "died (exit status 7)" in died.message
    assert [r.value[0] for r in fine] == [1, 2, 3]
    assert (pool.errors, pool.last_errors) == (before + 1, 1)
    assert len(pool.pids()) == 2 and all(alive(pid) for pid in pool.pids())


def test_worker_dead_while_idle_is_replaced_and_the_item_waits() -> None:
    with WorkerPool(WORKER, workers=1, setup={}, item_timeout_s=10) as p:
        [first] = p.run([_value(0)])
        old = first.value[1]
        os.kill(old, signal.SIGKILL)
        assert gone_soon(old)
        [reply] = p.run([_value(1)])
        assert reply.ok and reply.value[0] == 1 and reply.value[1] != old
        assert p.last_errors == 0


def test_stray_prints_do_not_corrupt_replies_and_stdin_is_devnull(pool: WorkerPool) -> None:
    assert [r.value for r in pool.run([{"action": "print"}] * 3)] == ["/dev/null"] * 3


# --- start-up ---------------------------------------------------------------------------------------------
def test_setup_failure_names_the_module_and_the_reason() -> None:
    p = WorkerPool(WORKER, workers=2, setup={"fail": "bad settings"}, item_timeout_s=10)
    with pytest.raises(RuntimeError, match=r"tests\.common\.pool_worker.*failed to start.*ValueError: bad settings"):
        p.run([_value(0)])
    assert p.pids() == []  # closed: nothing left running


def test_missing_worker_module_names_it_and_its_exit_status() -> None:
    with WorkerPool("tests.common.no_such_worker", workers=1, item_timeout_s=10) as p, \
            pytest.raises(RuntimeError, match=r"no_such_worker.*failed to start.*exit status 1"):
        p.run([_value(0)])


def test_start_deadline() -> None:
    with WorkerPool(WORKER, workers=1, setup={"sleep": 30}, item_timeout_s=10, start_timeout_s=0.5) as p:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"did not start within"):
            p.run([_value(0)])
        assert time.monotonic() - start < 5


def test_per_worker_setup_and_lazy_start() -> None:
    with WorkerPool(WORKER, workers=3, setup=lambda i: {"index": i}, item_timeout_s=10) as p:
        assert p.pids() == []  # nothing starts before the first run
        replies = p.run([{"action": "setup", "sleep": 0.3}] * 3)  # all ready first, so one item each
        assert sorted(r.value["index"] for r in replies) == [0, 1, 2]
        pids = p.pids()
    assert p.pids() == [] and not any(alive(pid) for pid in pids)


# --- order and threads ------------------------------------------------------------------------------------
def test_order_is_kept_over_several_workers() -> None:
    sleeps = [0.05 * ((i * 7) % 5) for i in range(30)]
    with WorkerPool(WORKER, workers=3, setup={}, item_timeout_s=10) as p:
        replies = p.run([_value(i, s) for i, s in enumerate(sleeps)])
        assert [r.value[0] for r in replies] == list(range(30))
        assert len({r.value[1] for r in replies}) == 3
        assert p.run([]) == []


def test_concurrent_runs_take_turns(pool: WorkerPool) -> None:
    results: dict[str, list[Reply]] = {}

    def run(tag: str) -> None:
        results[tag] = pool.run([_value(f"{tag}{i}", 0.01) for i in range(8)])

    threads = [threading.Thread(target=run, args=(tag,)) for tag in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for tag in "ab":
        assert [r.value[0] for r in results[tag]] == [f"{tag}{i}" for i in range(8)]


# --- dying with the parent --------------------------------------------------------------------------------
def _killed_while_busy(script: str, pid_files: list[Path]) -> list[int]:
    """Run `script` in a fresh interpreter, wait until every pid file is written (its workers are stuck in an
    item), SIGKILL it; returns what was running under it then and is still running 5 s later."""
    parent = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    tree: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not all(f.exists() and f.read_text() for f in pid_files):
            if parent.poll() is not None:
                pytest.fail(f"exited with {parent.returncode}: {parent.communicate()[1].decode()[-2000:]}")
            assert time.monotonic() < deadline, "its workers did not write their pid files within 60 s"
            time.sleep(0.05)
        tree = descendants(parent.pid)
        return left_after_kill(parent, tree)
    finally:
        kill_tree(parent, tree)


def test_a_killed_parent_takes_its_busy_workers_and_their_children_along(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    script = (f"from klear.common.workers import WorkerPool\n"
              f"WorkerPool({WORKER!r}, workers=1, setup={{}}, item_timeout_s=600).run("
              f"[{{'action': 'hang', 'pid_file': {str(pid_file)!r}}}])\n")
    assert _killed_while_busy(script, [pid_file]) == []
    worker, child = map(int, pid_file.read_text().split())
    assert not alive(worker) and not alive(child)


def test_ordered_map_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    pid_files = [tmp_path / f"{i}.pid" for i in range(2)]
    script = ("import os, time\n"
              "from klear.common.parallel import ordered_map\n"
              "def hang(path):\n"
              "    open(path, 'w').write(str(os.getpid()))\n"
              "    time.sleep(600)\n"
              f"list(ordered_map(hang, {[str(f) for f in pid_files]!r}, workers=2))\n")
    assert _killed_while_busy(script, pid_files) == []


def test_a_worker_lives_on_after_the_thread_that_started_it(tmp_path: Path) -> None:
    # A worker dies with the thread that started it, were it started from that thread; a caller's short-lived
    # thread (a ThreadPoolExecutor's) starts workers that serve later calls from other threads.
    with WorkerPool(WORKER, workers=1, setup={}, item_timeout_s=10) as p:
        starter = threading.Thread(target=p.run, args=([_value(0)],))
        starter.start()
        starter.join(60)
        [pid] = p.pids()
        time.sleep(0.5)
        assert alive(pid)
        [reply] = p.run([_value(1)])
        assert reply.value == (1, pid)


def test_a_process_whose_parent_is_already_gone_ends_at_once() -> None:
    # die_with_parent re-checks the parent after asking for the signal: one gone before the request sends none.
    script = "from klear.common.workers import die_with_parent\ndie_with_parent(1)\nprint('still here')\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and "still here" not in done.stdout
