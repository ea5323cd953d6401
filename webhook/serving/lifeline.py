"""The supervisor's children (workers, the controller, the metrics process) end when the
supervisor does, however it ends: SIGKILL and an OOM kill leave it no last act.

A child takes the supervisor's pid as it was *before the fork* (read afterwards, a dead
parent's pid is already the reaper's) and asks Linux to send it SIGTERM when its parent
dies (``PR_SET_PDEATHSIG``; it fires when the *thread* that forked the child ends, and
the supervisor starts no thread, so that is its main thread, for as long as it lives). A
thread polls the parent's pid too: where there is no prctl, when the parent died before
the request, and because a SIGTERM that comes before the process can act on it (a worker
whose server is not listening for it yet) is lost: it sends SIGTERM again until the
process is gone.

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
#: How often a child looks for its parent, and how often it asks itself again to stop.
POLL_SECONDS = 0.5
RESEND_SECONDS = 2.0


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
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    while True:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(RESEND_SECONDS)
