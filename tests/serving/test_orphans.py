"""Nothing outlives the supervisor: SIGKILLed (an OOM kill, a test run killed) at any
point of its start-up or after, its metrics process, controller and workers all end.

Each server's processes carry ``RPW_TEST_SERVER`` in their environment (``testkit.servers``),
so the ones left are found by walking /proc, whoever their parent is by then.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.servers import (
    command,
    eventually,
    free_port,
    marked,
    remove_metrics_dir,
    scaled,
    start,
    start_slot,
)

#: Where in the start-up the supervisor dies: the log line it is killed at.
POINTS = {
    # The metrics process was just started; nothing is forked yet.
    "metrics process started": "metrics",
    # The controller was just forked: it is importing the client, nowhere near its Lease.
    "controller forked": "controller started",
    # A worker serves; the others and the controller may still be starting.
    "a worker serving": "worker started",
    # Everything up: the controller holds the Lease.
    "controller leading": "leading",
}


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def logged(server, msg: str) -> bool:
    """Whether the server logged ``msg`` (a last line may be half written)."""
    for line in server.output().splitlines():
        try:
            if json.loads(line).get("msg") == msg:
                return True
        except ValueError:
            continue
    return False


def lease_requests(api: FakeAPI) -> int:
    return sum(1 for path, _ in api.requests if "/leases" in path)


@pytest.mark.parametrize("point", sorted(POINTS))
def test_nothing_outlives_a_supervisor_killed(point, api, tmp_path):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    with start_slot():
        server = start(
            tmp_path / "certs",
            "--kube",
            "kubeconfig",
            "--lease-namespace",
            "retry-policy-system",
            workers=2,
            metrics_port=free_port(),
            wait=False,
            env={"KUBECONFIG": str(kubeconfig), "POD_NAME": "victim"},
        )
        try:
            eventually(lambda: logged(server, POINTS[point]), timeout=60, interval=0.002)
            leases_before_kill = lease_requests(api)
            server.proc.send_signal(signal.SIGKILL)
        finally:
            if server.proc.poll() is None:
                server.proc.kill()
            server.proc.wait(scaled(10))
    if point == "controller forked":
        assert leases_before_kill == 0, "killed too late to be in the controller's start-up"
    try:
        eventually(lambda: not marked(server.mark))
    finally:
        left = {pid: command(pid) for pid in marked(server.mark)}
        for pid in left:  # a failure here must not leave them running either
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # Its metrics directory is left to the next server's start (test_metricsdir.py):
        # none starts after this one, so the test removes it as that start would.
        remove_metrics_dir(server)
        assert not left, f"still running after the supervisor died: {left}"
