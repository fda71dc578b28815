"""The sandbox's zygotes, and the programs they run, die with the process that started the pool, even a SIGKILLed
one (a stage killed by its pod, a test runner killed on timeout): nothing is left running untrusted code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.processes import alive, descendants

# A pool whose one slot runs a program that tries to fork, then sleeps past any test; the zygote is restarted
# from a thread that ends at once (as the code verifier's executor threads do), so the zygote killed below is
# one started from a short-lived thread.
_OWNER = textwrap.dedent("""
    import os, signal, sys, threading
    from klear.verifiers import SandboxPool, VerifierConfig

    pool = SandboxPool(VerifierConfig(code_workers=1, timeout_s=120.0, memory_mb=512))
    slot = pool._all[0]
    os.killpg(slot.proc.pid, signal.SIGKILL)
    slot.proc.wait()
    warm = threading.Thread(target=lambda: print(pool.run("print(6 * 7)").stdout.decode().strip(), flush=True))
    warm.start()
    warm.join()
    print(slot.proc.pid, flush=True)
    pool.run("import os, subprocess, sys, time\\n"
             "for attempt in (os.fork, lambda: subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])):\\n"
             "    try:\\n"
             "        if attempt() == 0:\\n"
             "            time.sleep(600)\\n"
             "    except OSError:\\n"
             "        pass\\n"
             "time.sleep(600)\\n")
""")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_zygotes_and_programs_die_with_a_sigkilled_owner(tmp_path: Path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(_OWNER)
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    left: list[int] = []
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "42"  # a zygote started from an ended thread still serves
        zygote = int(owner.stdout.readline())
        deadline = time.monotonic() + 30
        while not _children(zygote) and time.monotonic() < deadline:  # the program is running
            time.sleep(0.05)
        assert _children(zygote), "the sandboxed program never started"
        time.sleep(0.5)  # time for the program's fork attempts
        before = descendants(owner.pid)
        assert zygote in before
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 5
        while (left := [p for p in before if alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == [], f"still running after their owner was SIGKILLed: {left}"
    finally:
        owner.kill()
        owner.wait()
        for pid in left:
            os.kill(pid, signal.SIGKILL)
