"""The supervisor's children (workers, the controller, the metrics process) end when the
supervisor does, however it ends: SIGKILL and an OOM kill leave it no last act.

A child takes the supervisor's pid as it was *before the fork* (read afterwards, a dead
parent's pid is already the reaper's), asks Linux to send it SIGTERM when its parent dies
(``PR_SET_PDEATHSIG``), then checks the parent is still that pid: one that died before
the request sends nothing. The signal fires when the *thread* that forked the child
ends; the supervisor starts no thread, so that is its main thread, for as long as it
lives. Where there is no prctl, a thread polls the parent's pid instead.

SIGTERM, not SIGKILL: a leading controller releases its Lease and a worker finishes the
requests in flight, as when the supervisor stops them itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Any

#: ``PR_SET_PDEATHSIG`` from <linux/prctl.h>.
PR_SET_PDEATHSIG = 1
#: How often a child without prctl looks for its parent.
POLL_SECONDS = 0.5


def _find_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up once, in the supervisor: a child just forked only calls it.
_PRCTL = _find_prctl()


def forked_from(parent: int) -> None:
    """In a child the supervisor (``parent``, its pid before the fork) just forked: the
    supervisor's signal handlers are not ours (its SIGTERM handler would only set a flag
    in our copy of it), then ``bind``."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    bind(parent)


def bind(parent: int) -> None:
    """SIGTERM to this process once ``parent`` is gone, from now on."""
    if _PRCTL is None or _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        threading.Thread(target=_poll, args=(parent,), name="parent-watch", daemon=True).start()
    if os.getppid() != parent:  # it died before the request: nothing will tell us
        os.kill(os.getpid(), signal.SIGTERM)


def _poll(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)
