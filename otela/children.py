"""Child processes that cannot outlive their otela: the parent-death signal, and waiting
for an exit on a pidfd (no thread blocked in ``waitpid``).

Children are forked from the main thread on purpose: Linux delivers the parent-death signal
when the forking *thread* exits, and trio's ``open_process`` forks from a worker thread
that retires after ~10 s idle, which would kill a healthy child.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess

import trio

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


async def wait_exited(process: subprocess.Popen[bytes], pidfd: int) -> int:
    """Wait until ``process`` exits (``pidfd`` from ``os.pidfd_open``); its exit code."""
    while process.poll() is None:
        await trio.lowlevel.wait_readable(pidfd)
    return process.returncode
