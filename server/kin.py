"""What each child process of the server (a front-end worker, a python model's process) asks of the kernel
at its start: to be sent a signal when the process that started it dies (Linux's PR_SET_PDEATHSIG), so
that no child outlives a server that was killed, even with SIGKILL.

The kernel follows the thread that started the child: a child started from a thread that ends is sent the
signal then (server/backends/instance.py starts model processes on the thread that stays)."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """Asks for `signum` when the parent dies; False where the kernel cannot (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
