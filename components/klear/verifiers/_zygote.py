"""Sandbox zygote: a small, single-threaded Python process that forks one locked-down child per program.

Started by `klear.verifiers.sandbox` as `python3 -I -S _zygote.py` with a clean environment, so it
imports nothing but the standard library (and the libseccomp binding whose folder the harness passes
in). Forking a warm interpreter costs a few milliseconds, against ~12 ms for a fresh `python3 -I -S`.
Being single-threaded is what makes fork safe here; the harness that talks to it may be threaded.
It dies with the harness process that started it (parent-death signal), and each child dies with it.

Protocol on stdin/stdout: 4-byte big-endian length + pickle, harness -> zygote and back. Only the
trusted harness writes pickles to us; what a child sends back (stdout, stderr, result fd) is returned
as raw bytes and never unpickled. A child's fds are all the program's to write, so the result fd
carries values (`encode_value`), never verdicts: the harness compares them with expected outputs that
never enter this process (nor, so, any child forked from it).

Each child, in this order: new session, fds 0-3 only, private working directory, rlimits, per-slot
uid (when root), parent-death signal, no_new_privs, Landlock (filesystem, TCP, signal and
abstract-socket scoping), seccomp; then it runs the program in-process (no exec at all).
"""

from __future__ import annotations

import collections
import ctypes
import errno
import gc
import json
import os
import pickle
import resource
import select
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time

# Modules the programs commonly use (LiveCodeBench's helper imports): loaded once here, so children
# get them from memory and need not read the disk.
PRELOAD = (
    "array bisect builtins collections copy datetime decimal fractions functools heapq io itertools json "
    "math operator random re statistics string sys threading traceback typing"
).split()

PREAMBLE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\n"
    "from random import *\nfrom statistics import *\nfrom itertools import *\nfrom functools import *\n"
    "from operator import *\nfrom io import *\nfrom sys import *\nfrom json import *\n"
    "from builtins import *\nfrom typing import *\n"
    "import string, re, datetime, collections, heapq, bisect, copy, math, random, statistics, itertools\n"
    "import functools, operator, io, sys, json\n"
    "sys.setrecursionlimit(50000)\n"
)

# code_rules release: the names the released verl code reward puts before a call-based program (its
# code_r1_reward/utils.py BASE_IMPORTS and BASE_LEETCODE_IMPORTS), written here as ours. Where a name is bound twice
# there, the later binding holds (`bisect` and `copy` are the modules, `time` the function). A stdin program gets
# none of them: the release runs it bare. Executed in the program's process, so its import time counts against the
# test's timeout as there.
RELEASE_IMPORTS = """\
from bisect import bisect_left, bisect_right, insort
from collections import Counter, OrderedDict, defaultdict, deque
from copy import deepcopy
from functools import cache, cmp_to_key, lru_cache, partial, reduce
from heapq import heapify, heappop, heappush, heapreplace, merge, nlargest, nsmallest
from itertools import (accumulate, chain, combinations, count, cycle, groupby, islice, pairwise, permutations, product,
                       repeat, zip_longest)
from math import atan2, ceil, comb, factorial, floor, gcd, inf, isqrt, log, log2, log10, pi, prod, sqrt
from operator import iand, itemgetter, or_, sub, xor
from os.path import commonprefix
from random import randrange, shuffle
from re import search as re_search
from string import ascii_lowercase, ascii_uppercase
from time import time
from typing import Any, Callable, Deque, Dict, Generator, Iterable, Iterator, List, Optional, Set, Tuple, Union
import bisect, collections, copy, datetime, functools, heapq, io, itertools, math, operator, os, random, re, string
import sys
try:
    import numpy as np
except ImportError:  # not installed beside the verifier (the sandbox logged it): programs without it still run
    pass
try:
    import pandas as pd
except ImportError:
    pass


class ListNode:
    def __init__(self, val=0, next=None):
        self.val, self.next = val, next


class TreeNode:
    def __init__(self, val=0, left=None, right=None):
        self.val, self.left, self.right = val, left, right


def list_node(values):
    head = None
    for value in reversed(values):
        head = ListNode(value, head)
    return head


def is_same_list(l1, l2):
    while l1 and l2:
        if l1.val != l2.val:
            return False
        l1, l2 = l1.next, l2.next
    return l1 is None and l2 is None


def tree_node(values):
    if not values:
        return None
    root = TreeNode(values[0])
    parents, i = deque([root]), 1
    while parents and i < len(values):
        node = parents.popleft()
        for side in ("left", "right"):
            if i < len(values) and values[i] is not None:
                child = TreeNode(values[i])
                setattr(node, side, child)
                parents.append(child)
            i += 1
    return root


def is_same_tree(p, q):
    if not p or not q:
        return not p and not q
    return p.val == q.val and is_same_tree(p.left, q.left) and is_same_tree(p.right, q.right)
"""

EXIT_MEMORY = 3  # the program raised MemoryError (hit RLIMIT_AS)
EXIT_SETUP = 4  # the sandbox could not be set up: never run the program then
HIGH_FD = 100  # where the zygote keeps directory fds that children inherit

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36

# --- Landlock (uapi/linux/landlock.h); syscall numbers are the same on x86_64 and aarch64 ---------
SYS_landlock_create_ruleset = 444
SYS_landlock_add_rule = 445
SYS_landlock_restrict_self = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

# Filesystem rights each ABI knows; handling all of them means "denied unless a rule grants it".
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
READ_ONLY = FS_READ_FILE | FS_READ_DIR
WORKDIR = (
    FS_WRITE_FILE | FS_READ_FILE | FS_READ_DIR | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR
    | FS_MAKE_REG | FS_MAKE_FIFO | FS_MAKE_SYM | FS_REFER | FS_TRUNCATE
)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel struct is __attribute__((packed))
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is absent or disabled."""
    abi = _libc.syscall(SYS_landlock_create_ruleset, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(abi), 0)


def _errcheck(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def apply_landlock(abi: int, read_fds: list[int], rw_fds: list[tuple[int, int]]) -> None:
    """Restrict this process: read `read_fds` trees, `rw_fds` with given rights, no TCP, scoped signals."""
    fs = _FS_BY_ABI.get(abi, (1 << 16) - 1)
    attr = _RulesetAttr(fs, (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
                        (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _errcheck(_libc.syscall(SYS_landlock_create_ruleset, ctypes.byref(attr), size, 0),
                        "landlock_create_ruleset")
    try:
        # A tree may be one file (a single-module package such as six.py): directory rights are invalid there.
        reads = [(fd, READ_ONLY if stat.S_ISDIR(os.fstat(fd).st_mode) else FS_READ_FILE) for fd in read_fds]
        for fd, rights in reads + rw_fds:
            rule = _PathBeneath(rights & fs, fd)
            _errcheck(_libc.syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                                    ctypes.byref(rule), 0), "landlock_add_rule")
        _errcheck(_libc.syscall(SYS_landlock_restrict_self, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


# --- seccomp, through libseccomp --------------------------------------------------------------
_DENIED = (
    "fork vfork execve execveat ptrace mount umount2 unshare setns bpf keyctl add_key request_key "
    "io_uring_setup io_uring_enter io_uring_register process_vm_readv process_vm_writev perf_event_open "
    "kexec_load kexec_file_load init_module finit_module delete_module pivot_root chroot userfaultfd "
    "open_by_handle_at name_to_handle_at fsopen fsmount fspick move_mount open_tree mount_setattr "
    "pidfd_getfd seccomp acct swapon swapoff reboot settimeofday clock_settime adjtimex quotactl "
    "syslog iopl ioperm vhangup"
).split()
CLONE_THREAD = 0x00010000


def build_seccomp():
    """Deny-list filter: threads but no processes, no exec, only AF_UNIX socket pairs, no kernel-facing calls."""
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    for name in _DENIED:
        try:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        except (OSError, ValueError):
            pass  # a syscall this kernel/arch does not have cannot be called either
    # clone without CLONE_THREAD makes a process; with it, a thread (bounded by RLIMIT_NPROC and AS).
    f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    # clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # Only unnamed AF_UNIX pairs (asyncio's self-pipe, threads talking): socket() itself is refused, since
    # connecting to a pathname UNIX socket (a runtime's control socket) is not something Landlock mediates.
    f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket")
    f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socketpair", sc.Arg(0, sc.NE, 1))  # 1 = AF_UNIX
    return f


# --- the child ---------------------------------------------------------------------------------
def _to_jsonable(value):
    """LiveCodeBench compares functional results after turning tuples into lists."""
    if isinstance(value, tuple | list):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_jsonable(v) for k, v in value.items()}
    return value


# --- returned values on the result channel (official, runner) ------------------------------------
# lcb_runner compares a returned value with `==` in the program's own process; here the harness does it, on a copy
# of the value as plain data of these exact types, whose `==` is Python's own (a subclass's or any other object's
# __eq__ is the program's code, able to claim any equality: such a value is opaque, equal to nothing).
_DICTS = (dict, collections.defaultdict, collections.OrderedDict, collections.Counter)  # `==` of dict with a dict
_SMALL_INT_BITS = 60  # larger ints travel as hex: int<->decimal text is limited to 4,300 digits, hex is not


def _tagged(value):
    """`value` as JSON-able data: lists as arrays, other containers and big ints as one-key tagged objects."""
    kind = type(value)
    if value is None or kind in (bool, str, float):
        return value
    if kind is int:
        return value if value.bit_length() <= _SMALL_INT_BITS else {"int": hex(value)}
    if kind is list:
        return [_tagged(v) for v in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [_tagged(v) for v in value]}
    if kind in _DICTS:
        return {"dict": [[_tagged(k), _tagged(v)] for k, v in value.items()]}
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray) and value.size != 1:
        # what numpy raises where lcb_runner takes the truth of `array == expected`
        raise ValueError("The truth value of an array with more than one element is ambiguous.")
    if numpy is not None and isinstance(value, numpy.generic):
        item = value.item()  # a numpy scalar compares as the Python number it holds
        if type(item) is not kind:
            return _tagged(item)
    return {"opaque": kind.__qualname__}


def encode_value(value) -> bytes:
    """A returned value as one line of ASCII JSON for the result fd (see `decode_value`)."""
    return json.dumps(_tagged(value), separators=(",", ":")).encode()


_CONTAINERS = {"tuple": tuple, "set": set, "frozenset": frozenset, "dict": dict}


def _untag(obj: dict):
    """The value of one tagged object of `_tagged`'s."""
    ((tag, v),) = obj.items() if len(obj) == 1 else ((None, None),)
    if tag == "opaque":
        return object()  # equal to nothing but itself
    if tag == "int" and isinstance(v, str):
        return int(v, 16)
    if tag in _CONTAINERS and isinstance(v, list):
        return _CONTAINERS[tag](v)
    raise ValueError(f"not a tagged value: {sorted(obj)[:3]}")


def decode_value(data: bytes):
    """The value `encode_value` wrote. Raises ValueError, TypeError or RecursionError on anything else (bytes the
    program wrote itself, alone or around the harness's): such a result can only fail its test."""
    return json.loads(data.decode("ascii"), object_hook=_untag)


def _child(job: dict, state: dict, fds: tuple[int, int, int, int], workdir: str) -> None:
    """Lock this freshly forked process down, then run the program. Never returns."""
    stdin_fd, out_w, err_w, res_w = fds
    os.setsid()  # own process group: the zygote kills the whole group
    for target, fd in ((0, stdin_fd), (1, out_w), (2, err_w), (3, res_w)):
        os.dup2(fd, target)
    lib_fds = [fd for fd, _ in state["read_fds"]]
    os.closerange(4, HIGH_FD)
    os.closerange(HIGH_FD + len(lib_fds), 1 << 20)
    os.chdir(workdir)
    r = resource
    cpu = job.get("cpu_limit_s") or int(job["timeout_s"]) + 1  # a shared-module run: the sum of its tests'
    mem = job["memory_mb"] << 20
    for res, value in ((r.RLIMIT_CORE, (0, 0)), (r.RLIMIT_CPU, (cpu, cpu + 1)),
                       (r.RLIMIT_FSIZE, (job["file_limit"],) * 2), (r.RLIMIT_NOFILE, (job["nofile"],) * 2),
                       (r.RLIMIT_NPROC, (job["nproc"] + state["nproc_base"],) * 2), (r.RLIMIT_AS, (mem, mem))):
        r.setrlimit(res, value)
    uid = state["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
    if os.getppid() != state["zygote_pid"]:
        os._exit(EXIT_SETUP)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; a file past RLIMIT_FSIZE now kills
    _errcheck(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    if state["landlock_abi"]:
        wd = os.open(".", os.O_PATH | os.O_DIRECTORY)  # the path above it may be closed to this uid
        dev = [(os.open(p, os.O_PATH), rights) for p, rights in
               (("/dev/null", FS_READ_FILE | FS_WRITE_FILE), ("/dev/zero", FS_READ_FILE),
                ("/dev/urandom", FS_READ_FILE)) if os.path.exists(p)]
        apply_landlock(state["landlock_abi"], lib_fds, [(wd, WORKDIR)] + dev)
        for fd, _ in dev:
            os.close(fd)
        os.close(wd)
    if state["seccomp"] is not None:
        state["seccomp"].load()
    _run_program(job, state, workdir)


def _run_program(job: dict, state: dict, workdir: str) -> None:
    import builtins
    import threading

    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir,
                       # numpy's BLAS would start a thread per core at import (LiveCodeBench sets OMP_NUM_THREADS=1)
                       "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    # The program's own streams, and the __std*__ originals too, so nothing reaches the zygote's pipes.
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="replace", closefd=False)  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", closefd=False)  # type: ignore[misc]
    code = 0
    official = job.get("rules") in ("official", "runner")  # runner: official plus lcb_runner's artifacts
    release = job.get("rules") == "release"
    try:
        if release:
            # `python program.py` as the released reward runs it: a bare module, Python's own recursion and
            # int-digit limits, the builtins `site` adds (exit() and quit(): this zygote runs without site, -S); a
            # call-based program after the release's names.
            site = __import__("site")
            site.setquit()
            site.setcopyright()
            site.sethelper()
            namespace: dict = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None}
            if job["fn_name"] is not None:
                exec(compile(RELEASE_IMPORTS, "<release imports>", "exec"), namespace)
        else:
            # The helper imports were executed once in the zygote; this child has its own (copy-on-write)
            # copy of that namespace, so it is used as is (copying would touch every object's refcount).
            namespace = state["preamble_ns"]
            namespace.update(__name__="__main__", __builtins__=builtins, stdin=sys.stdin, stdout=sys.stdout,
                             stderr=sys.stderr)
            sys.setrecursionlimit(50000)
        if official:
            sys.set_int_max_str_digits(50000)  # lcb_runner's compute_code_generation_metrics raises the limit
            if job["fn_name"] is not None:
                namespace["__name__"] = "tmp_sol"  # lcb_runner imports call-based code as a module: no main block
        if job.get("rules") == "runner" and job["fn_name"] is None:
            _run_as_lcb_runner(job["code"], namespace)
        else:
            exec(compile(job["code"], "<solution>", "exec"), namespace)
        if job.get("calls") is not None:
            _call_runner_shared(job, namespace)
        elif job["fn_name"] is not None and (official or release):
            _call_official(job, namespace)
        elif job["fn_name"] is not None:
            args = [__import__("json").loads(line) for line in job["args"].split("\n") if line.strip()]
            result = getattr(namespace["Solution"](), job["fn_name"])(*args)
            payload = __import__("json").dumps(_to_jsonable(result)).encode()
            os.write(3, payload)
        for thread in threading.enumerate():  # like interpreter exit: wait for non-daemon threads
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    except SystemExit as exc:  # official: lcb_runner swallows SystemExit, whatever its code
        code = 0 if exc.code in (None, 0) or official else 1
    except MemoryError:
        code = EXIT_MEMORY
    except BaseException:  # noqa: BLE001 - any exception of the program is a runtime error
        try:
            __import__("traceback").print_exc()
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except MemoryError:
        code = EXIT_MEMORY
    except BaseException:  # noqa: BLE001
        code = code or 1
    os._exit(code)


def lcb_runner_source(code: str) -> str:
    """The program as lcb_runner's grade_stdio compiles it (clean_if_name, then make_function): a last statement
    `if __name__ == '__main__':` (in that spelling) replaced by its body, then every top-level statement but the
    imports moved into `def wrapped_function():`. Code that does not parse is returned as is."""
    import ast

    try:
        body = ast.parse(code).body
    except SyntaxError:
        return code
    if body and isinstance(body[-1], ast.If) and ast.unparse(body[-1].test).strip() == "__name__ == '__main__'":
        body = body[:-1] + body[-1].body
    imports = [stmt for stmt in body if isinstance(stmt, (ast.Import, ast.ImportFrom))]
    rest = [stmt for stmt in body if not isinstance(stmt, (ast.Import, ast.ImportFrom))]
    no_args = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
    wrapped = ast.FunctionDef(name="wrapped_function", args=no_args, body=rest, decorator_list=[], lineno=1)
    return ast.unparse(ast.Module(body=[*imports, wrapped], type_ignores=[]))


class _LcbRunnerStdin:
    """sys.stdin as lcb_runner's call_method mocks it: read() is the whole input on every call, readline() reads
    lines, readlines() is input.split("\n") (an empty last line after a final newline), no iteration; the rest
    (fileno, so input() reads through readline) of an in-memory text stream."""

    def __init__(self, text: str):
        import io

        self._text, self._stream, self.buffer = text, io.StringIO(text), _LcbRunnerStdinBuffer(text.encode())

    def read(self, *args: object) -> str:
        return self._text

    def readline(self, *args: object) -> str:
        return self._stream.readline(*args)  # type: ignore[arg-type]

    def readlines(self, *args: object) -> list[str]:
        return self._text.split("\n")

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


class _LcbRunnerStdinBuffer:
    """sys.stdin.buffer as lcb_runner mocks it: read() is the whole input, readline() always the first line."""

    def __init__(self, data: bytes):
        self._data = data

    def read(self, *args: object) -> bytes:
        return self._data

    def readline(self, *args: object) -> bytes:
        return self._data.split(b"\n")[0] + b"\n"


def _run_as_lcb_runner(code: str, namespace: dict) -> None:
    """A stdin program run as lcb_runner runs it (code_rules runner): compiled as `lcb_runner_source`, in module
    tmp_sol, then wrapped_function() called with the mocked stdin, open() returning the input, and stdout
    captured in a StringIO (no .buffer); SystemExit ends the call quietly. The process's own fds 0 and 1 lead
    nowhere meanwhile, so os.read(0), os.write(1) and streams bound at import miss the test, as there. The
    captured text is what the harness compares."""
    import builtins
    import io

    text = sys.stdin.read()
    result_fd = os.dup(1)
    for fd, flags in ((0, os.O_RDONLY), (1, os.O_WRONLY)):
        null = os.open(os.devnull, flags)
        os.dup2(null, fd)
        os.close(null)
    captured = io.StringIO()
    try:
        namespace["__name__"] = "tmp_sol"
        exec(compile(lcb_runner_source(code), "<solution>", "exec"), namespace)
        wrapped = namespace.get("wrapped_function")
        if wrapped is None:  # the runner's compile step fails: every test is an error
            raise RuntimeError("lcb_runner: no wrapped_function (the program does not parse)")
        saved = sys.stdin, sys.stdout, builtins.open
        sys.stdin, sys.stdout = _LcbRunnerStdin(text), captured
        builtins.open = lambda *args, **kwargs: io.StringIO(text)  # type: ignore[assignment]
        try:
            wrapped()
        except SystemExit:
            pass
        finally:
            sys.stdin, sys.stdout, builtins.open = saved
    finally:
        data = memoryview(captured.getvalue().encode("utf-8", "replace"))
        while data:
            data = data[os.write(result_fd, data):]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _call_official(job: dict, namespace: dict) -> None:
    """lcb_runner's call-based run (rules official and runner; release too, whose test programs assert `==` on the
    call): Solution().fn_name, or a module-level function when the code has no `class Solution`; the result (a
    top-level tuple made a list) goes to the result fd as `encode_value` writes it, for the harness to compare with
    the expected value (lcb_runner's `==`, done where the program cannot reach)."""
    json = __import__("json")
    args = [json.loads(line) for line in job["args"].split("\n")]
    owner = namespace["Solution"]() if "class Solution" in job["code"] else None
    method = getattr(owner, job["fn_name"]) if owner is not None else namespace[job["fn_name"]]
    result = method(*args)
    if isinstance(result, tuple):
        result = list(result)
    _write_all(3, encode_value(result))


def _call_runner_shared(job: dict, namespace: dict) -> None:
    """lcb_runner's grade_call_based over all of a problem's tests (code_rules runner): the module executed once, one
    Solution (or the module) and its bound method for every test, in order, so what a test leaves (module globals,
    attributes, class-level caches, mutable defaults) is there in the next, as in the runner. The result fd gets a
    line after the setup ("ready") and after each test ("ok SECONDS VALUE", VALUE as `encode_value` writes it, or
    "error SECONDS"), each of which restarts the zygote's per-test clock. The harness judges each line, and ends the
    process at the first failure when it stops there, as the runner does."""
    import time as clock
    import traceback

    json = __import__("json")
    calls = [[json.loads(line) for line in args.split("\n")] for args in job["calls"]]
    owner = namespace["Solution"]() if "class Solution" in job["code"] else None
    method = getattr(owner, job["fn_name"]) if owner is not None else namespace[job["fn_name"]]
    os.write(3, b"ready\n")
    for args in calls:
        start = clock.perf_counter()
        try:
            result = method(*args)
            seconds = clock.perf_counter() - start  # the call alone, as the runner times it
            if isinstance(result, tuple):
                result = list(result)
            line = b"ok %.4f %s\n" % (seconds, encode_value(result))
        except MemoryError:
            raise  # the process's memory_limit names this test
        except (Exception, SystemExit):  # noqa: BLE001 - the runner's -4 (a SystemExit there fails every test)
            traceback.print_exc()
            line = b"error %.4f\n" % (clock.perf_counter() - start)
        _write_all(3, line)


# --- the zygote side ---------------------------------------------------------------------------
def _children() -> list[int]:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def _sweep() -> None:
    """Kill and reap every process left under us (we are a subreaper, so orphans come back to us)."""
    for _ in range(100):
        kids = _children()
        for kid in kids:
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
        if not kids:
            return
        time.sleep(0.001)


def run_job(job: dict, state: dict, harness: tuple | None = None) -> dict:
    """Run one job in a fresh child and collect what it wrote. `harness`: this zygote's own (stdin, stdout) streams;
    a shared-module run with `report_lines` sends the harness each complete result line as it comes ({"lines": ...})
    and ends the program when the harness answers {"stop": True} (it judged a test failed)."""
    workdir = tempfile.mkdtemp(prefix="job-", dir=state["workdir_root"])
    if state["uid"] is not None:
        os.chown(workdir, state["uid"], state["uid"])
    stdin_fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    data = job["stdin"]
    view = memoryview(data)
    while view:
        view = view[os.write(stdin_fd, view):]
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    res_r, res_w = os.pipe2(os.O_CLOEXEC)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _child(job, state, (stdin_fd, out_w, err_w, res_w), workdir)
        except BaseException as exc:  # noqa: BLE001 - report the setup failure, never run unconfined
            try:
                os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
            finally:
                os._exit(EXIT_SETUP)
        os._exit(EXIT_SETUP)
    for fd in (stdin_fd, out_w, err_w, res_w):
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    deadline = start + job["timeout_s"]
    limit = job["output_limit"]
    bufs = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray()}
    caps = {out_r: limit, err_r: 16384, res_r: limit}
    poller = select.poll()
    for fd in (out_r, err_r, res_r, pidfd):
        poller.register(fd, select.POLLIN)
    open_fds = {out_r, err_r, res_r}
    report = harness is not None and job.get("report_lines")
    if report:
        poller.register(0, select.POLLIN)
    # A shared-module run: the "ready" line and each test's but the last restart the clock; extra lines the program
    # writes itself buy it no time.
    resets = len(job["calls"]) if job.get("calls") is not None else 0
    lines = sent = 0
    timed_out = output_exceeded = exited = stopped = False
    while open_fds or not exited:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = not exited
            break
        for fd, _ in poller.poll(max(1, int(left * 1000))):
            if fd == pidfd:
                exited = True
                poller.unregister(pidfd)
                continue
            if fd == 0:
                message = _read_message(harness[0])  # type: ignore[index]
                if message is None:  # the harness closed our stdin: finish this job as usual
                    poller.unregister(0)
                stopped = bool(message and message.get("stop"))
                if stopped:
                    break
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
                continue
            if fd == res_r and b"\n" in chunk and not exited:
                if lines < resets:
                    deadline = time.monotonic() + job["timeout_s"]  # a shared-module run: each test its own time
                lines += chunk.count(b"\n")
            room = caps[fd] - len(bufs[fd])
            bufs[fd] += chunk[:max(room, 0)]
            if len(chunk) > room and fd != err_r:  # stderr is only kept for messages: drop the rest
                output_exceeded = True
            if report and fd == res_r:
                end = bufs[res_r].rfind(b"\n") + 1
                if end > sent:
                    _write_message(harness[1], {"lines": bytes(bufs[res_r][sent:end])})  # type: ignore[index]
                    sent = end
        if output_exceeded or stopped:
            break
        if exited:
            # The program is gone; its pipes reach EOF at once unless a stray process still holds them.
            deadline = min(deadline, time.monotonic() + 0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, status, usage = os.wait4(pid, 0)
    wall = time.monotonic() - start
    _sweep()
    for fd in (out_r, err_r, res_r, pidfd):
        os.close(fd)
    if not state["keep_workdir"]:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "timed_out": timed_out,
        "output_exceeded": output_exceeded,
        "stopped": stopped,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "maxrss_kb": usage.ru_maxrss,
        "stdout": bytes(bufs[out_r]),
        "stderr": bytes(bufs[err_r]),
        "result": bytes(bufs[res_r]),
        "workdir": workdir,
    }


def _read_message(stream):
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return pickle.loads(stream.read(size))


def _write_message(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _setup(config: dict) -> dict:
    """Check the kernel, open the read-only trees as inheritable fds, build the seccomp filter."""
    abi = landlock_abi()
    problems = []
    if abi < config["min_landlock_abi"]:
        problems.append(f"Landlock ABI {abi} < {config['min_landlock_abi']} (need TCP rules and signal scoping)")
    seccomp = None
    if config["seccomp_dir"]:
        sys.path.insert(0, config["seccomp_dir"])
        try:
            seccomp = build_seccomp()
        except Exception as exc:  # noqa: BLE001 - reported to the harness, which decides
            problems.append(f"seccomp unavailable: {exc!r}")
        finally:
            sys.path.pop(0)
    else:
        problems.append("seccomp binding (pyseccomp) not found")
    if problems and not config["allow_unconfined"]:
        return {"ok": False, "error": "; ".join(problems)}
    read_fds = []
    for i, path in enumerate(p for p in config["read_paths"] if os.path.exists(p)):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        high = HIGH_FD + i
        os.dup2(fd, high, inheritable=True)
        os.close(fd)
        read_fds.append((high, path))
    site = _site_folder(config.get("site_dir"), config.get("site_packages") or [], read_fds, config["uid"])
    site_entry = site
    if site:
        fd = os.open(site, os.O_PATH | os.O_CLOEXEC)
        high = HIGH_FD + len(read_fds)
        os.dup2(fd, high, inheritable=True)
        os.close(fd)
        read_fds.append((high, site))
        # A slot uid reaches the folder through its inherited fd, as the stdlib: the path above it (a caller's
        # workdir_root) may be closed to that uid.
        site_entry = f"/proc/self/fd/{high}" if config["uid"] is not None else site
    uid = config["uid"]
    nproc_base = 0
    if uid is None:
        # Without a uid of its own the child shares RLIMIT_NPROC's count with every process of ours.
        me = os.getuid()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == me:
                        nproc_base += len(os.listdir(f"/proc/{entry}/task"))
                except OSError:
                    pass
    for name in PRELOAD:
        __import__(name)
    if uid is not None:
        _import_through_fds(read_fds, set(config["stdlib_paths"]))
    if site_entry:
        sys.path.append(site_entry)  # after the stdlib remapping, which keeps only the stdlib's entries
    preamble_ns: dict = {}
    exec(PREAMBLE.replace("sys.setrecursionlimit(50000)\n", ""), preamble_ns)
    preamble_ns.pop("__builtins__", None)
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # Children share the zygote's pages copy-on-write; a garbage collection walking every object would
    # copy them all. Frozen objects are never walked.
    gc.collect()
    gc.freeze()
    state = {
        "landlock_abi": abi if abi >= 1 else 0,
        "seccomp": seccomp,
        "read_fds": read_fds,
        "stdlib_paths": set(config["stdlib_paths"]),
        "uid": uid,
        "nproc_base": nproc_base,
        "zygote_pid": os.getpid(),
        "workdir_root": config["workdir_root"],
        "keep_workdir": config["keep_workdir"],
        "preamble_ns": preamble_ns,
    }
    return {"ok": True, "state": state, "landlock_abi": abi, "seccomp": seccomp is not None,
            "problems": problems}


def _site_folder(site_dir: str | None, packages: list[tuple[str, str]], read_fds: list[tuple[int, str]],
                 uid: int | None) -> str | None:
    """A folder of links to the offered packages' trees (each readable by its own Landlock rule), the one
    entry programs import them from. A slot uid reaches a tree through its inherited fd, as the stdlib. A zygote
    that replaces a dead one finds its predecessor's links: they are made anew (the fd numbers may differ)."""
    if not site_dir or not packages:
        return None
    fds = {path: fd for fd, path in read_fds}
    os.makedirs(site_dir, mode=0o755, exist_ok=True)
    for name, path in packages:
        if path in fds:
            link = os.path.join(site_dir, name)
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(f"/proc/self/fd/{fds[path]}" if uid is not None else path, link)
    return site_dir


def _import_through_fds(read_fds: list[tuple[int, str]], stdlib: set[str]) -> None:
    """Point imports at /proc/self/fd/N instead of the stdlib's path.

    A per-slot uid may be unable to walk the path to the stdlib (e.g. under a 0700 /root), but an
    inherited directory fd needs no search permission. The fd numbers are the same in every child.
    """
    mapping = [(path, f"/proc/self/fd/{fd}") for fd, path in read_fds if path in stdlib]
    mapping.sort(key=lambda m: -len(m[0]))  # lib-dynload before its parent folder

    def remap(path: str) -> str:
        for old, new in mapping:
            if path == old or path.startswith(old + "/"):
                return new + path[len(old):]
        return path

    sys.path[:] = [remap(p) for p in sys.path if remap(p) != p]
    for module in list(sys.modules.values()):
        paths = getattr(module, "__path__", None)
        if isinstance(paths, list):
            paths[:] = [remap(p) for p in paths]
    sys.path_importer_cache.clear()


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    config = _read_message(stdin)
    if config is None:
        return
    # Die with the harness, even a SIGKILLed one stuck mid-job (EOF on stdin is only read between jobs); the
    # program's child dies with us in turn (its own parent-death signal). Checked after the request: a harness
    # gone before it sends no signal.
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != config["parent_pid"]:
        os._exit(1)
    reply = _setup(config)
    state = reply.pop("state", None)
    _write_message(stdout, reply)
    if state is None:
        return
    while True:
        job = _read_message(stdin)
        if job is None:
            return
        if job.get("stop"):
            continue  # a stop that crossed its job's end: nothing is left to stop
        try:
            result = run_job(job, state, (stdin, stdout))
        except Exception as exc:  # noqa: BLE001 - the harness turns this into sandbox_error
            result = {"error": repr(exc)}
        _write_message(stdout, result)


if __name__ == "__main__":
    main()
