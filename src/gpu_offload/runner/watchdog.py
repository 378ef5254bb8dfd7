"""Parent-death watchdog: a runner whose kernel dies ends itself, so no runner outlives its notebook.

Linux delivers ``PR_SET_PDEATHSIG`` when the parent *thread* that forked us exits, which can happen while
the kernel lives on (a kernel may spawn from a worker thread). So the signal only wakes a check, and the
check (also run by a polling thread, for other platforms and for a ``--parent-pid`` that is not our direct
parent) decides by whether the parent process is really gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from .signals import block_in_this_thread

PR_SET_PDEATHSIG = 1
POLL_SECONDS = 0.25
GRACE_SECONDS = 3.0
"""How long the cell gets to unwind after the interrupt before the runner kills itself."""


def parent_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # the state letter follows the command name, which is in parentheses and may hold spaces
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def arm(parent_pid: int, on_death: Callable[[], None]) -> None:
    """Call ``on_death`` once, from any thread, as soon as ``parent_pid`` has exited."""
    direct = os.getppid() == parent_pid
    fired = threading.Lock()

    def gone() -> bool:
        return (direct and os.getppid() != parent_pid) or not parent_alive(parent_pid)

    def fire() -> None:
        if fired.acquire(blocking=False):
            on_death()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if gone():
            fire()

    if direct and sys.platform.startswith("linux"):
        signal.signal(signal.SIGHUP, on_signal)
        _set_pdeathsig(signal.SIGHUP)

    def poll() -> None:
        block_in_this_thread()
        while not gone():
            time.sleep(POLL_SECONDS)
        fire()

    threading.Thread(target=poll, name="gpuo-watchdog", daemon=True).start()


def _set_pdeathsig(signum: int) -> None:
    # CDLL(None) is the running program, libc included: no library search (ctypes.util would cost a
    # cold start ~50 ms of imports). Without prctl the polling thread still watches.
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)


def hard_exit_later(code: int, grace: float = GRACE_SECONDS, kill_group: bool = True) -> None:
    """After ``grace`` seconds, end the runner with ``code``; with ``kill_group``, and (when the runner
    leads its process group) everything the cell started."""

    def finish() -> None:
        block_in_this_thread()
        time.sleep(grace)
        if kill_group and os.getpgrp() == os.getpid():
            # the runner leads its own group (started with start_new_session): take the cell's
            # subprocesses along, the runner included
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(code)

    threading.Thread(target=finish, name="gpuo-exit", daemon=True).start()
