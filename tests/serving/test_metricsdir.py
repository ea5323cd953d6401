"""A killed server leaves nothing behind: the metrics directory of a server that is gone
(``webhook.serving.metricsdir``) is removed when the next one starts. In the chart,
``/tmp`` is a memory volume that survives the container's restarts, so without this a
crash loop would fill it, a directory per start. (tests/conftest.py fails a run whose
servers leave one behind.)"""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

from testkit.builders import FULL, job, review
from testkit.servers import eventually, free_port, marked, metrics_dir, scaled, start, stop
from webhook.serving import metricsdir


def _dirs(tmp: Path) -> set[Path]:
    return set(tmp.glob(metricsdir.DIR_PREFIX + "*"))


def test_a_killed_servers_directory_is_removed_by_the_next_start(tmp_path):
    tmp = tmp_path / "tmp"  # the chart's TMPDIR (an emptyDir), this test's own
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    # A directory without an owner file is an older version's (or one being made): it may
    # belong to a server that still runs, so it is never removed.
    older = tmp / (metricsdir.DIR_PREFIX + "older")
    older.mkdir()
    (older / "counter_1.db").write_bytes(b"")
    running = start(tmp_path / "certs", metrics_port=free_port(), env=env)
    second = None
    try:
        killed = start(tmp_path / "certs", metrics_port=free_port(), workers=2, env=env)
        mine = metrics_dir(killed)
        assert mine is not None and mine.parent == tmp
        assert metricsdir.owner(mine) == {"pid": killed.proc.pid, "parent": os.getpid()}
        assert not metricsdir.dead(mine)
        killed.proc.send_signal(signal.SIGKILL)  # as an OOM kill: no clean-up of its own
        killed.proc.wait(scaled(10))
        eventually(lambda: not marked(killed.mark))  # its workers and metrics process too
        assert mine.is_dir() and metricsdir.dead(mine)  # left behind, until:
        second = start(tmp_path / "certs", metrics_port=free_port(), env=env)
        assert not mine.exists()
        assert {metrics_dir(running), metrics_dir(second), older} == _dirs(tmp)
        assert second.review("/mutate", review(job(FULL)))["response"]["allowed"]
    finally:
        stop(running)
        if second is not None:
            stop(second)
    assert _dirs(tmp) == {older}  # a server stopped removes its own


def test_only_a_directory_nobody_holds_is_dead(tmp_path):
    held = tmp_path / (metricsdir.DIR_PREFIX + "held")
    held.mkdir()
    (held / metricsdir.OWNER).write_text('{"pid": 1, "parent": 1}')
    lock = os.open(held / metricsdir.OWNER, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)  # its server, alive
    unowned = tmp_path / (metricsdir.DIR_PREFIX + "unowned")
    unowned.mkdir()
    other = tmp_path / "something-else"
    other.mkdir()
    (other / metricsdir.OWNER).write_text("{}")
    linked = tmp_path / (metricsdir.DIR_PREFIX + "link")
    linked.symlink_to(other)
    try:
        assert not metricsdir.dead(held) and not metricsdir.dead(unowned)
        assert metricsdir.remove_dead_dirs(tmp_path) == []
    finally:
        os.close(lock)  # its server gone
    assert metricsdir.dead(held)
    assert metricsdir.remove_dead_dirs(tmp_path) == [held]
    assert not held.exists()
    assert unowned.is_dir() and other.is_dir() and linked.is_symlink()
