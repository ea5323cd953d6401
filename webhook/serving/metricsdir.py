"""The directory of the metrics files every process of one server writes
(``prometheus_client``'s multiprocess mode, ``webhook.serving.metrics``): made at start,
removed at stop, and, for a server that could not remove its own (killed), removed by
the next one to start.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("webhook.metrics")

ENV = "PROMETHEUS_MULTIPROC_DIR"
#: A directory ``prepare_multiprocess_dir`` makes under ``$TMPDIR``: this prefix, and in it
#: ``OWNER``, a file its server holds locked (``flock``) for as long as it or any process it
#: forked lives, naming it (``{"pid": ..., "parent": ...}``).
DIR_PREFIX = "retry-webhook-metrics-"
OWNER = ".owner"
#: The lock on this process's own directory, held until ``release_multiprocess_dir``.
_OWNED: list[int] = []


def prepare_multiprocess_dir() -> tuple[Path, bool]:
    """The directory for the workers' metric files and whether it was created here:
    ``$PROMETHEUS_MULTIPROC_DIR`` when set, else a new one under ``$TMPDIR``; emptied
    either way (files of a previous run would be added to this run's counters).

    A server stopped removes the directory it made (``release_multiprocess_dir``); one
    killed (SIGKILL, an OOM kill) cannot, and in the chart ``/tmp`` is a memory volume
    that outlives a container's restarts, so a crash loop would fill it: each start
    first removes the directories of servers that are gone (``remove_dead_dirs``)."""
    given = os.environ.get(ENV)
    created = not given
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for entry in path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    else:
        parent = Path(tempfile.gettempdir())
        remove_dead_dirs(parent)
        path = _owned_dir(parent)
        os.environ[ENV] = str(path)
    if "prometheus_client" in sys.modules:  # imported early: switch its value class too
        from prometheus_client import values

        values.ValueClass = values.get_value_class()
    return path, created


def _owned_dir(parent: Path) -> Path:
    """A new directory under ``parent`` whose ``OWNER`` this process holds locked. The
    file is locked before it takes its name, so ``dead`` never finds it unlocked while
    its server lives (a directory without it is left alone: one being made, or an older
    version's)."""
    path = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=parent))
    making = path / (OWNER + ".new")
    fd = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": os.getpid(), "parent": os.getppid()}).encode())
    os.rename(making, path / OWNER)
    # Forked processes share the lock (the workers, the controller): it is released when
    # the last of them ends, however it ends.
    _OWNED.append(fd)
    return path


def release_multiprocess_dir(path: Path) -> None:
    """Remove the directory ``prepare_multiprocess_dir`` made, and let go of its lock."""
    shutil.rmtree(path, ignore_errors=True)
    while _OWNED:
        os.close(_OWNED.pop())


def dead(path: Path) -> bool:
    """Whether ``path`` is the multiprocess directory of a server that is gone: it has an
    ``OWNER`` file and no process holds its lock."""
    try:
        fd = os.open(path / OWNER, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its server (or a process it forked) still runs
        return False
    finally:
        os.close(fd)  # (the lock, when taken, with it)
    return True


def owner(path: Path) -> dict[str, Any] | None:
    """What ``OWNER`` says of the server that made ``path`` (``None``: nothing readable)."""
    try:
        found = json.loads((path / OWNER).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def remove_dead_dirs(parent: Path) -> list[Path]:
    """Remove the multiprocess directories under ``parent`` whose server is gone
    (``dead``); the ones removed."""
    removed = []
    for path in sorted(parent.glob(DIR_PREFIX + "*")):
        if path.is_dir() and not path.is_symlink() and dead(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        log.info(
            "removed metrics directories of servers gone", extra={"dirs": list(map(str, removed))}
        )
    return removed
