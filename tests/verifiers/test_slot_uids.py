"""Slot uids are claimed on the host: two pools never share one, a closed or killed pool's uids are free again, and
two real sandbox pools started from the same slot_uid_base do not share RLIMIT_NPROC's count."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from klear.verifiers.config import VerifierConfig
from klear.verifiers.sandbox import SandboxPool, kernel_support
from klear.verifiers.slot_uids import UidClaim


def test_claims_from_one_base_are_disjoint_and_released_uids_are_taken_again(tmp_path: Path) -> None:
    first = UidClaim(62000, 2, folder=str(tmp_path))
    second = UidClaim(62000, 2, folder=str(tmp_path))
    assert (first.uids, second.uids) == ([62000, 62001], [62002, 62003])
    first.release()
    assert UidClaim(62000, 3, folder=str(tmp_path)).uids == [62000, 62001, 62004]


def test_a_killed_process_leaves_its_uids_free(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom klear.verifiers.slot_uids import UidClaim\n"
         f"claim = UidClaim(62000, 2, folder={str(tmp_path)!r})\nprint(claim.uids, flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "[62000, 62001]"
        assert UidClaim(62000, 1, folder=str(tmp_path)).uids == [62002]  # the other process's are skipped
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert UidClaim(62000, 2, folder=str(tmp_path)).uids == [62000, 62001]


def test_too_few_free_uids_is_an_error_that_names_the_folder_and_holds_nothing(tmp_path: Path) -> None:
    held = UidClaim(62000, 2, folder=str(tmp_path), searched=3)
    with pytest.raises(RuntimeError, match=rf"no 2 free sandbox uids in 62000..62002.*{tmp_path}"):
        UidClaim(62000, 2, folder=str(tmp_path), searched=3)
    assert UidClaim(62002, 1, folder=str(tmp_path)).uids == [62002]  # the failed claim let its one uid go
    held.release()


THREAD_HOG = """
import threading, time
started = 0
try:
    while True:
        threading.Thread(target=time.sleep, args=(4,), daemon=True).start()
        started += 1
except RuntimeError:
    pass
print(started, flush=True)
time.sleep(4)
"""
THREADS_8 = """
import threading, time
threads = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("8 threads")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="slot uids need root")
@pytest.mark.skipif(kernel_support()["landlock_abi"] < 6 or not kernel_support()["seccomp"],
                    reason="the sandbox needs Landlock ABI 6 and seccomp")
def test_two_pools_from_one_base_do_not_share_a_thread_limit() -> None:
    config = VerifierConfig(code_workers=1, timeout_s=8.0, memory_mb=512, nproc=16, slot_uid_base=62100)
    with SandboxPool(config) as hog_pool, SandboxPool(config) as pool, ThreadPoolExecutor(1) as background:
        assert set(hog_pool.uids).isdisjoint(pool.uids)
        hog = background.submit(hog_pool.run, THREAD_HOG)
        time.sleep(1.5)  # the hog holds every thread its limit allows
        result = pool.run(THREADS_8)
        assert result.status == "ok" and result.stdout.decode().strip() == "8 threads", result.stderr
        assert 8 <= int(hog.result().stdout.decode()) < 16  # the limit held it
