"""The uids a sandbox pool's slots run as, claimed on this host so that no two pools share one.

A uid is shared state: RLIMIT_NPROC counts every process and thread of a uid on the host. Two pools whose slots
ran as the same uid (two judges, two test workers, two GPPO reward workers started with the same `slot_uid_base`)
would share one limit, and a fork bomb in one would leave the other's programs unable to start a thread. So a pool
takes its uids from `slot_uid_base` upward, skipping any that another live pool holds: a uid is held by an
exclusive flock on a lock file, which the kernel releases when the pool closes it or its process dies, so a killed
pool leaves nothing to clean up.

The lock files live in /run/lock (or /tmp where that is missing): processes that share that folder coordinate.
Containers with folders of their own (two pods on one node) do not see each other's claims.
"""

from __future__ import annotations

import fcntl
import os

SEARCHED_UIDS = 4096  # how far past its first uid a pool looks for free ones


def lock_dir() -> str:
    """Where claims are kept: /run/lock, where the host has it, else /tmp."""
    return "/run/lock" if os.path.isdir("/run/lock") and os.access("/run/lock", os.W_OK) else "/tmp"


class UidClaim:
    """`count` uids from `first` upward that no other live claim on this host holds, in increasing order; they are
    this claim's until `release()` or the end of the process."""

    def __init__(self, first: int, count: int, folder: str | None = None, searched: int = SEARCHED_UIDS) -> None:
        self.folder = folder or lock_dir()
        self.uids: list[int] = []
        self._fds: list[int] = []
        for uid in range(first, first + searched):
            if len(self.uids) == count:
                break
            path = os.path.join(self.folder, f"klear-sandbox-uid-{uid}.lock")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another pool's
                os.close(fd)
                continue
            self.uids.append(uid)
            self._fds.append(fd)
        if len(self.uids) < count:
            self.release()
            raise RuntimeError(f"no {count} free sandbox uids in {first}..{first + searched - 1}: other pools hold "
                               f"them (lock files klear-sandbox-uid-*.lock in {self.folder})")

    def release(self) -> None:
        """Give the uids back (the lock files stay: removing one another pool is about to lock would let two
        pools hold the same uid)."""
        for fd in self._fds:
            os.close(fd)
        self._fds, self.uids = [], []
