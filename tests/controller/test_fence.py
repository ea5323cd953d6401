"""A former leader stops at its renew deadline (``webhook.controller.fence``).

The right to act ends at the last successful renewal's *start* plus ``renew_deadline``, on
the leader's own monotonic clock; every reconciler write goes through a client that
refuses it past that, and cuts a write's timeout at it; the manager stops the reconcilers
and its process there, even while a call to the API hangs. Against the HTTP test API with
the real ``kubernetes`` client, whose Lease writes the tests make hang (``before_write``
blocked on an Event: the API server never answers), and through a real server."""

from __future__ import annotations

import json
import threading
import time

import pytest
from kubernetes import client

from testkit.fakeapi import FakeAPI
from testkit.replicas import FAST, NS, coordination, lease, readyz, replica
from testkit.servers import eventually, stop
from webhook.controller.fence import Fence, FenceClosed, fenced_client
from webhook.controller.lease import LeaderElector, LeaseConfig
from webhook.controller.manager import ControllerOptions, Manager

#: A lease well longer than the renew deadline: the margin a write sent before the fence
#: may take to land.
SLOW = {"lease_seconds": 3.0, "renew_deadline": 1.0, "retry_period": 0.1}
JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "train", "namespace": "ml", "uid": "uid-train"},
    "spec": {},
    "status": {},
}


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def hang_lease_writes(fake: FakeAPI) -> threading.Event:
    """From now on every write of a Lease waits, unanswered, until the Event is set."""
    answer = threading.Event()

    def hold(method, resource, name):
        if resource == "leases":
            answer.wait(60)

    fake.before_write = hold
    return answer


# --- the deadline -------------------------------------------------------------------------------


def test_a_renewal_fences_from_when_it_started_not_when_it_returned(api, tmp_path):
    """A renewal the API took 3 s to answer gives no right to act with a 1 s deadline: a
    standby counts the lease from when it saw the renewal, which may be as early as it was
    sent."""
    # upstream: renew, tryAcquireOrRenew (k8s.io/client-go tools/leaderelection/
    # leaderelection.go): each renewal runs under a context with a RenewDeadline timeout
    now = [100.0]
    cfg = LeaseConfig(NS, "retry-policy-webhook-controller", "a", **FAST)
    a = LeaderElector(coordination(api, tmp_path), cfg, clock=lambda: now[0])
    assert a.try_acquire_or_renew()
    assert a.fence.until == 100.0 + FAST["renew_deadline"] and a.fence.holds()
    now[0] = 100.5
    assert a.fence.remaining() == pytest.approx(0.5)

    def slow(method, resource, name):
        if resource == "leases":
            now[0] += 3.0  # the API answers 3 s later

    api.before_write = slow
    a.leading.set()
    assert a.try_acquire_or_renew()  # renewed...
    assert a.fence.until == 100.5 + FAST["renew_deadline"]  # ...from when it was sent
    assert not a.fence.holds()  # and that is over: no act on it


# --- the writes -------------------------------------------------------------------------------


def configuration(fake: FakeAPI) -> client.Configuration:
    return client.Configuration(host=fake.url)


def patch_job(api_client, value: str) -> None:
    client.BatchV1Api(api_client).patch_namespaced_job(
        "train", "ml", {"metadata": {"labels": {"n": value}}}, _preload_content=False
    )


def test_the_fenced_client_reads_freely_and_cuts_a_write_at_the_fence(api):
    api.put("jobs", json.loads(json.dumps(JOB)))
    fence = Fence()
    fenced = fenced_client(configuration(api), fence)
    with pytest.raises(FenceClosed):  # never led
        patch_job(fenced, "0")
    fence.extend(time.monotonic() + 30)
    patch_job(fenced, "1")
    # A write that hangs ends at the fence (0.5 s away), not at some default (none).
    answer = threading.Event()
    api.before_write = lambda method, resource, name: resource == "jobs" and answer.wait(60)
    fence = Fence()
    fence.extend(time.monotonic() + 0.5)
    with pytest.raises(Exception, match=r"(?i)timed? ?out") as cut:
        patch_job(fenced_client(configuration(api), fence), "2")
    assert not isinstance(cut.value, FenceClosed)
    answer.set()
    fence.close()
    found = client.BatchV1Api(fenced_client(configuration(api), fence)).read_namespaced_job(
        "train", "ml", _preload_content=False
    )
    assert json.loads(found.data)["metadata"]["name"] == "train"  # reads are never fenced


class Writer:
    """A reconciler that writes as fast as it can, one Job patch after another, and does
    not look at its stop event (a loop that keeps writing until its process exits)."""

    name = "writer"

    def __init__(self, api_client):
        self.api_client = api_client
        self.written: list[float] = []
        self.refused: list[float] = []
        self.done = threading.Event()
        self.stop: threading.Event | None = None

    def run(self, stop: threading.Event) -> None:
        self.stop = stop
        while not self.done.is_set():
            try:
                patch_job(self.api_client, str(len(self.written)))
                self.written.append(time.monotonic())
            except FenceClosed:
                self.refused.append(time.monotonic())
                time.sleep(0.01)
            except Exception:  # a write cut at the fence (a timeout): again
                time.sleep(0.01)


def test_no_reconciler_write_goes_out_after_the_deadline_while_the_lease_call_hangs(api, tmp_path):
    """The leader's Lease update hangs (the API server never answers): the manager stops
    at the fence without waiting for it, its reconcilers are told to stop, and no write of
    theirs reaches the API once the fence refused one."""
    # upstream: renew (k8s.io/client-go tools/leaderelection/leaderelection.go): the
    # renewal's wait ends at RenewDeadline even while tryAcquireOrRenew has not returned
    api.put("jobs", json.loads(json.dumps(JOB)))
    arrived: list[float] = []
    fence = Fence()
    writer = Writer(fenced_client(configuration(api), fence))
    options = ControllerOptions(NS, "retry-policy-webhook-controller", "a", **SLOW)
    manager = Manager(coordination(api, tmp_path), options, [writer], fence=fence)
    result: list[tuple[int, float]] = []
    thread = threading.Thread(
        target=lambda: result.append((manager.run(), time.monotonic())), daemon=True
    )
    thread.start()
    eventually(lambda: len(writer.written) >= 3, 10)
    answer = hang_lease_writes(api)
    hold = api.before_write
    api.before_write = lambda m, r, n: (
        r == "jobs" and arrived.append(time.monotonic()),
        hold(m, r, n),
    )
    try:
        eventually(lambda: result, 10)  # returned, the Lease update still unanswered
        assert not answer.is_set() and lease(api)["spec"]["holderIdentity"] == "a"
        code, returned = result[0]
        assert code == 1 and returned >= fence.until
        assert writer.stop is not None and writer.stop.is_set()  # told to stop
        eventually(lambda: len(writer.refused) >= 20, 10)
        assert writer.refused[0] >= fence.until
        # Nothing reached the API by the earliest a standby could act (it waits a lease
        # duration from when it saw the last renewal, sent after the fence's start)...
        standby = fence.until - SLOW["renew_deadline"] + SLOW["lease_seconds"]
        assert arrived and all(at < standby for at in arrived)
        # ...and after the first refusal at most the one write cut at the fence, late.
        assert len([at for at in arrived if at > writer.refused[0]]) <= 1
    finally:
        writer.done.set()
        answer.set()


def test_a_real_leader_whose_lease_update_hangs_ends_its_controller_process(api, tmp_path):
    """``retry-webhook serve``: the controller process exits (1, lost) at its fence while
    its Lease update hangs, and the supervisor starts a standby in its place."""
    server = replica(tmp_path, api, "solo")
    try:
        eventually(lambda: readyz(server).get("leader"), 15)
        answer = hang_lease_writes(api)
        try:

            def exited() -> list[dict]:
                return [
                    line
                    for line in server.logs()
                    if line.get("msg") == "controller exited; starting another"
                ]

            (line,) = eventually(exited, 15)
            assert line["exit_code"] == 1 and not answer.is_set()
            assert any(line.get("msg", "").startswith("lost the Lease") for line in server.logs())
        finally:
            answer.set()
    finally:
        stop(server)
