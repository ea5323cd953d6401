"""The controller's leader election: one replica acts, the others stand by and take over.

The elector runs with the real ``kubernetes`` client against the HTTP test API, whose
Leases have the API's write semantics (409 Conflict on a stale ``resourceVersion``,
409 AlreadyExists on a second create); the server tests run ``retry-webhook serve``
replicas as deployed, with their controller processes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from kubernetes import client, config

from testkit.builders import P
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.gates import gated_pod
from testkit.replicas import FAST, NS, STEADY, coordination, elector, lease, readyz, replica
from testkit.servers import eventually, scaled, start, stop
from webhook.cluster.leadership import LeaderNote, LeaderState
from webhook.controller.lease import GATES_ANNOTATION, LeaderElector, LeaseConfig
from webhook.controller.manager import ControllerOptions, Manager

LEASE_NAME = "retry-policy-webhook-controller"


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def test_the_first_replica_creates_the_lease_and_holds_it(api, tmp_path):
    # upstream: tryAcquireOrRenew (client-go tools/leaderelection/leaderelection.go):
    # no Lease yet: create it, holding it.
    a = elector(api, tmp_path, "a")
    assert a.try_acquire_or_renew()
    spec = lease(api)["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 2
    assert spec["acquireTime"] == spec["renewTime"] and spec["leaseTransitions"] == 0
    a.leading.set()
    before = spec["renewTime"]
    time.sleep(0.01)
    assert a.try_acquire_or_renew()  # a renewal keeps acquireTime, moves renewTime
    after = lease(api)["spec"]
    assert after["acquireTime"] == spec["acquireTime"] and after["renewTime"] != before


def test_a_standby_waits_for_the_lease_to_lapse_on_its_own_clock(api, tmp_path):
    # upstream: isLeaseValid: observedTime + leaseDurationSeconds, the observation time
    # on this replica's clock, not the record's renewTime (clocks may disagree).
    a = elector(api, tmp_path, "a")
    assert a.try_acquire_or_renew()
    now = [100.0]
    b = LeaderElector(
        coordination(api, tmp_path),
        LeaseConfig(NS, "retry-policy-webhook-controller", "b", **FAST),
        clock=lambda: now[0],
        wall=lambda: 0.0,  # a wall clock far behind: it must not matter
    )
    assert not b.try_acquire_or_renew()  # observed now: valid for 2 s from here
    now[0] += 1.9
    assert not b.try_acquire_or_renew()
    now[0] += 0.2
    assert b.try_acquire_or_renew()  # unchanged for longer than its duration: taken
    spec = lease(api)["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


def test_a_renewal_seen_by_the_standby_restarts_its_wait(api, tmp_path):
    a = elector(api, tmp_path, "a")
    a.leading.set()
    assert a.try_acquire_or_renew()
    now = [0.0]
    b = LeaderElector(
        coordination(api, tmp_path),
        LeaseConfig(NS, "retry-policy-webhook-controller", "b", **FAST),
        clock=lambda: now[0],
    )
    assert not b.try_acquire_or_renew()
    now[0] = 1.9
    time.sleep(0.01)
    assert a.try_acquire_or_renew()  # the leader renews
    assert not b.try_acquire_or_renew()  # a changed record: observed again at 1.9
    now[0] = 3.0
    assert not b.try_acquire_or_renew()


def test_of_two_replicas_taking_a_lapsed_lease_at_once_one_wins(api, tmp_path):
    """Both read the same resourceVersion; the update is a precondition, so the second
    write gets 409 Conflict (the test API's, as the API server's) and stays a standby."""
    a = elector(api, tmp_path, "a")
    a.leading.set()
    assert a.try_acquire_or_renew()
    assert a.release()  # empty holder: free for anyone
    b = elector(api, tmp_path, "b")
    c = elector(api, tmp_path, "c")
    barrier = threading.Barrier(2)
    results: dict[str, bool] = {}

    def take(name, e):
        barrier.wait()
        results[name] = e.try_acquire_or_renew()

    threads = [threading.Thread(target=take, args=(n, e)) for n, e in (("b", b), ("c", c))]
    both_read = threading.Barrier(2, timeout=scaled(10))
    api.before_write = lambda method, resource, name: both_read.wait()  # both read first
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == [False, True], results
    winner = "b" if results["b"] else "c"
    assert lease(api)["spec"]["holderIdentity"] == winner
    assert ("PUT", "retry-policy-webhook-controller", 409) in api.failed_writes


def test_a_released_lease_is_taken_within_a_retry_period(api, tmp_path):
    # upstream: tryRelease: holder emptied, leaseDurationSeconds 1 (ReleaseOnCancel).
    a = elector(api, tmp_path, "a", lease_seconds=30)
    a.leading.set()
    assert a.try_acquire_or_renew()
    b = elector(api, tmp_path, "b", lease_seconds=30)
    assert not b.try_acquire_or_renew()
    assert a.release()
    spec = lease(api)["spec"]
    assert "holderIdentity" not in spec and spec["leaseDurationSeconds"] == 1
    assert b.try_acquire_or_renew()  # no holder: no wait at all


@pytest.mark.slow
def test_lease_writes_slower_than_a_retry_period_still_make_a_leader(api, tmp_path):
    """client-go's ``acquire`` sets no deadline of its own and ``renew`` runs a round under
    one ``RenewDeadline``: a Lease write that takes longer than a retry period (an
    overloaded API server) is waited for, and the replica leads. (A 2 s timeout per call
    with 2.5 s writes used to abandon every write while it landed: no replica led.)"""
    api.write_delay["leases"] = 0.6
    slow = {"lease_seconds": 3.0, "renew_deadline": 2.0, "retry_period": 0.2}
    a = LeaderElector(coordination(api, tmp_path), LeaseConfig(NS, LEASE_NAME, "a", **slow))
    stop_event = threading.Event()
    thread = threading.Thread(target=a.run, args=(stop_event,), daemon=True)
    thread.start()
    try:
        assert a.leading.wait(scaled(10)), "a write slower than a retry period made no leader"
        renewed = lease(api)["spec"]["renewTime"]
        eventually(lambda: lease(api)["spec"]["renewTime"] != renewed, 10)
        assert a.leading.is_set()  # it renews, and keeps leading
        # A renewal is one write (the fast path), with no read before it.
        before = len(api.writes)
        eventually(lambda: len(api.writes) > before, 10)
    finally:
        stop_event.set()
        thread.join(scaled(10))


@pytest.mark.slow
def test_no_leadership_is_claimed_while_no_renewal_lands_in_time(api, tmp_path):
    """A write that comes back after the renew deadline extended nothing: the replica
    never says it leads (``tryAcquireOrRenew`` within ``renew``'s deadline)."""
    api.write_delay["leases"] = 1.2
    slow = {"lease_seconds": 2.0, "renew_deadline": 1.0, "retry_period": 0.2}
    a = LeaderElector(coordination(api, tmp_path), LeaseConfig(NS, LEASE_NAME, "a", **slow))
    stop_event = threading.Event()
    thread = threading.Thread(target=a.run, args=(stop_event,), daemon=True)
    thread.start()
    try:
        eventually(lambda: a.errors >= 2, 15)
        assert not a.leading.wait(scaled(3))
        assert not a.fence.holds()
        # Its writes land though it never hears back in time: the Lease they leave must
        # not tell admission that a leader releases gates.
        written = eventually(lambda: api.get("leases", LEASE_NAME, NS), 15)
        assert written["metadata"]["annotations"][GATES_ANNOTATION] != "ok"
    finally:
        stop_event.set()
        thread.join(scaled(10))


def test_a_leader_that_cannot_renew_stops_leading(api, tmp_path):
    # upstream: renew (k8s.io/client-go tools/leaderelection/leaderelection.go): the
    # elector stops leading when no renewal succeeds within RenewDeadline
    a = elector(api, tmp_path, "a")
    stop_event, lost = threading.Event(), threading.Event()
    thread = threading.Thread(target=a.run, args=(stop_event, lost.set), daemon=True)
    thread.start()
    assert a.leading.wait(scaled(5))
    api.forbidden.add(("leases", "retry-policy-webhook-controller"))  # the API refuses
    assert lost.wait(scaled(5)) and not a.leading.is_set() and a.fence.closed
    api.forbidden.clear()
    thread.join(scaled(5))  # it ends on its own: a lost leader is done (its process exits)
    assert not thread.is_alive() and not a.leading.is_set()
    stop_event.set()


def test_the_manager_runs_reconcilers_only_while_leading_and_publishes(api, tmp_path):
    note = LeaderNote()
    ran = threading.Event()

    class Probe:
        name = "probe"

        def run(self, stop):
            ran.set()
            stop.wait()

    options = ControllerOptions(NS, "retry-policy-webhook-controller", "a", **FAST)
    manager = Manager(coordination(api, tmp_path), options, [Probe()], note)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    assert ran.wait(scaled(5))
    state = eventually(lambda: note.read() if note.read().leader else None, 5)
    assert state.holder == "a" and state.recently_renewed()
    manager.stop.set()
    thread.join(scaled(10))
    assert "holderIdentity" not in lease(api)["spec"]  # released on a clean stop


def test_a_clean_stop_writes_what_its_reconcilers_left_before_the_lease_goes(api, tmp_path):
    """SIGTERM: the reconcilers stop (their last flushes), then ``drain`` writes what they
    queued (the Events, their held series) while the fence still holds, and only then is
    the Lease released (client-go's ``ReleaseOnCancel`` releases once leading ended).
    Before, the elector released the Lease, closing the fence, as soon as the stop came:
    the last writes were refused."""
    seen: list[tuple[str, bool, str | None]] = []

    class Probe:
        name = "probe"

        def run(self, stop):
            stop.wait()
            holder = lease(api)["spec"].get("holderIdentity")
            seen.append(("reconciler", manager.fence.holds(), holder))

    def drain() -> None:
        seen.append(("drain", manager.fence.holds(), lease(api)["spec"].get("holderIdentity")))

    options = ControllerOptions(NS, "retry-policy-webhook-controller", "a", **FAST)
    manager = Manager(coordination(api, tmp_path), options, [Probe()], drain=drain)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    eventually(lambda: manager._threads, 5)
    manager.stop.set()
    thread.join(scaled(10))
    assert seen == [("reconciler", True, "a"), ("drain", True, "a")]
    assert "holderIdentity" not in lease(api)["spec"] and manager.fence.closed


def test_a_leading_manager_waits_between_its_rounds(api, tmp_path):
    """While it leads, the manager's loop flushes its metrics every 0.2 s, no more: a loop
    that waited on ``leading`` (set the whole time) spun a core (benchmarks/controller_cpu.py
    found it)."""
    flushes = []

    class Counting:
        def leader(self, leading: bool) -> None:
            pass

        def flush(self) -> None:
            flushes.append(time.monotonic())

    class Probe:
        name = "probe"

        def run(self, stop):
            stop.wait()

    options = ControllerOptions(NS, "retry-policy-webhook-controller", "a", **FAST)
    manager = Manager(coordination(api, tmp_path), options, [Probe()], recorder=Counting())
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    eventually(lambda: manager._threads, 5)
    seen = len(flushes)
    for _ in range(5):  # five of its rounds, at most, meanwhile
        manager.stop.wait(0.2)
    later = len(flushes)
    manager.stop.set()
    thread.join(scaled(10))
    assert later - seen <= 10  # a spinning loop flushed tens of thousands of times


def test_a_note_that_stops_being_written_means_no_live_leader():
    state = LeaderState(enabled=True, leader=True, holder="a", renewed_at=100, written_at=100)
    assert state.recently_renewed(now=110)
    assert not state.recently_renewed(now=116)  # the controller process went silent
    assert not LeaderState().recently_renewed(now=0)
    standby = LeaderState(enabled=True, holder="b", renewed_at=90, written_at=109)
    assert standby.recently_renewed(now=104) and not standby.recently_renewed(now=109)


# --- through the real server -------------------------------------------------------------


def test_two_replicas_elect_one_and_the_other_takes_over_when_it_dies(api, tmp_path):
    one = replica(tmp_path, api, "one")
    two = replica(tmp_path, api, "two")
    try:
        first = eventually(lambda: readyz(one).get("holder"), 10)
        leader, standby = (one, two) if first.startswith("one_") else (two, one)
        assert eventually(lambda: readyz(standby).get("holder") == first, 10)
        assert readyz(leader)["leader"] and not readyz(standby)["leader"]
        assert readyz(standby)["leaseLive"]
        os.killpg(leader.proc.pid, signal.SIGKILL)  # no release: the Lease must lapse
        leader.proc.wait(scaled(5))
        taken = eventually(lambda: readyz(standby)["leader"], 15)
        assert taken and lease(api)["spec"]["holderIdentity"].startswith(
            "two_" if standby is two else "one_"
        )
        assert lease(api)["spec"]["leaseTransitions"] >= 1
    finally:
        for server in (one, two):
            if server.proc.poll() is None:
                stop(server)


def test_a_stopped_leader_hands_over_at_once_and_no_controller_is_off(api, tmp_path):
    one = replica(tmp_path, api, "one", "--lease-duration", "30", "--renew-deadline", "20")
    two = replica(tmp_path, api, "two", "--lease-duration", "30", "--renew-deadline", "20")
    off = replica(tmp_path, api, "off", "--no-controller")
    try:
        assert readyz(off) == {"enabled": False, "reason": "--no-controller"}
        holder = eventually(lambda: readyz(one).get("holder"), 10)
        leader, standby = (one, two) if holder.startswith("one_") else (two, one)
        eventually(lambda: readyz(standby).get("holder"), 10)
        started = time.monotonic()
        stop(leader)  # SIGTERM: the controller releases its Lease
        assert eventually(lambda: readyz(standby)["leader"], 10)
        assert time.monotonic() - started < min(scaled(10), 25)  # well within the 30 s lease
    finally:
        for server in (one, two, off):
            if server.proc.poll() is None:
                stop(server)


# --- Events ---------------------------------------------------------------------------------

from webhook.cluster.events import Event, EventRecorder, Regarding  # noqa: E402

JOB = Regarding("batch/v1", "Job", "ml", "train", "job-uid-1")


def events_api(fake: FakeAPI, tmp_path: Path) -> client.EventsV1Api:
    path = write_kubeconfig(tmp_path / f"kubeconfig-ev-{time.monotonic_ns()}", fake.url)
    return client.EventsV1Api(config.new_client_from_config(str(path)))


def stored_events(fake: FakeAPI) -> list[dict]:
    with fake.lock:
        return [dict(v) for (ns, _), v in fake.named["events"].items() if ns == "ml"]


def test_an_event_is_written_as_events_k8s_io_v1_regarding_the_workload(api, tmp_path):
    recorder = EventRecorder(events_api(api, tmp_path), "webhook-0")
    note = "attempt 3 of 4: container trainer 1Gi -> 1536Mi after 1 OOM kill"
    assert recorder.emit(Event(JOB, "Normal", "RetryMemoryIncreased", note))
    assert recorder.flush()
    (event,) = stored_events(api)
    assert event["reportingController"] == "retry-policy.dev/webhook"
    assert event["reportingInstance"] == "webhook-0" and event["action"] == "Admit"
    assert event["regarding"] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "namespace": "ml",
        "name": "train",
        "uid": "job-uid-1",
    }
    assert (event["type"], event["reason"], event["note"]) == (
        "Normal",
        "RetryMemoryIncreased",
        note,
    )
    # a MicroTime (the client writes it with an offset; the API's RFC3339Micro takes both)
    assert datetime.fromisoformat(event["eventTime"].replace("Z", "+00:00")).tzinfo
    assert "series" not in event
    assert event["metadata"]["name"].startswith("train.")


def test_the_same_decision_again_counts_into_one_event_across_recorders(api, tmp_path):
    """Two processes (or replicas) deciding the same: one Event, its series counting."""
    one = EventRecorder(events_api(api, tmp_path), "webhook-0")
    two = EventRecorder(events_api(api, tmp_path), "webhook-1")
    same = Event(JOB, "Normal", "RetryOnNonSpot", "attempt 4 of 4: on a non-spot node")
    for recorder in (one, two, one):
        recorder.emit(same)
        assert recorder.flush()
    other = Event(JOB, "Normal", "RetryOnNonSpot", "attempt 3 of 4: on a non-spot node")
    one.emit(other)
    assert one.flush()
    events = sorted(stored_events(api), key=lambda e: e["note"])
    assert [e["note"] for e in events] == [other.note, same.note]
    assert "series" not in events[0] and events[1]["series"]["count"] == 3
    assert one.stats()["aggregated"] == 1 and two.stats()["aggregated"] == 1


def test_a_workload_gets_a_burst_of_events_then_one_per_refill(api, tmp_path):
    now = [1000.0]
    recorder = EventRecorder(
        events_api(api, tmp_path), "w", burst=3, refill_seconds=60, clock=lambda: now[0]
    )
    for n in range(5):
        recorder.emit(Event(JOB, "Normal", "RetryNodesAvoided", f"attempt {n + 2}"))
    assert recorder.flush()
    assert len(stored_events(api)) == 3 and recorder.stats()["dropped"] == 2
    now[0] += 60
    recorder.emit(Event(JOB, "Normal", "RetryNodesAvoided", "attempt 9"))
    recorder.emit(Event(JOB, "Normal", "RetryNodesAvoided", "attempt 10"))
    assert recorder.flush()
    assert len(stored_events(api)) == 4
    other = Regarding("batch/v1", "Job", "ml", "other", "job-uid-2")  # its own bucket
    recorder.emit(Event(other, "Normal", "RetryNodesAvoided", "attempt 2"))
    assert recorder.flush() and len(stored_events(api)) == 5


def test_an_api_that_fails_event_writes_loses_them_without_blocking_emit(api, tmp_path):
    recorder = EventRecorder(events_api(api, tmp_path), "w", capacity=2, retry_seconds=0.01)
    api.stop()  # nothing listens any more: every write is a connection error
    started = time.monotonic()
    accepted = [recorder.emit(Event(JOB, "Normal", "RetryDelayed", f"n{n}")) for n in range(50)]
    assert time.monotonic() - started < scaled(0.5)  # emit never waits on the API
    assert accepted.count(True) >= 2 and accepted.count(False) >= 40
    assert recorder.flush(10)
    assert recorder.stats()["written"] == 0 and recorder.stats()["dropped"] == 50


# --- RBAC: the chart grants every call the controller makes --------------------------------


@pytest.mark.slow  # renders the chart with helm, through a cached helper the finder misses
def test_the_chart_grants_every_call_the_controller_makes(api, tmp_path):
    """The controller, with every reconciler it runs, against the test API holding a Job
    of each kind our rules fail (``test_events.put_failed_jobs``), and a worker's Event
    writes (a JobSet's pod's decision, twice: created, then counted); then each request
    made is checked against the rendered chart's RBAC for the webhook's ServiceAccount
    (``testkit/rbac.py`` reads requests as the API server's RBAC does)."""
    from testkit.chart import NAMESPACE as CHART_NS
    from testkit.chart import deployment_pod, render
    from testkit.events import put_failed_jobs, stored_events
    from testkit.rbac import calls, denied
    from webhook.cluster.events import recorder_for
    from webhook.controller import reconcilers
    from webhook.kinds.registry import WORKLOADS

    helm_path = _find_helm()
    warnings = put_failed_jobs(api)
    # A pod held back by a retry-delay gate whose time has come: the gate releaser
    # (webhook/controller/gates.py) lists, watches and patches it.
    api.put("pods", gated_pod("overdue", time.time() - 60))
    # The chart's admission policy in front of its pod and workload writes, as the API
    # server runs it (testkit/vap.py): every write below must be one it lets through.
    from testkit.chart import one
    from testkit.vap import Policy, gate

    chart = render(helm_path, {})
    user = f"system:serviceaccount:{CHART_NS}:{deployment_pod(chart)['spec']['serviceAccountName']}"
    api.admit = gate(Policy(one(chart, "ValidatingAdmissionPolicy")), user)
    api.requests.clear()
    path = write_kubeconfig(tmp_path / "kubeconfig-rbac", api.url)
    api_client = config.new_client_from_config(str(path))
    options = ControllerOptions(CHART_NS, "retry-policy-webhook-controller", "a", **STEADY)
    events, resolver = recorder_for(api_client, "a", WORKLOADS)
    manager = Manager(
        client.CoordinationV1Api(api_client),
        options,
        reconcilers.build(api_client, options, events, resolver),
    )
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    assert manager.elector.leading.wait(scaled(5))
    # What the reconcilers act on: a Job's and a JobSet's failed pods (their histories).
    from testkit.records import JOBSET_LABELS, a_job, a_jobset, child_job, failed_pod

    api.put("jobs", a_job("recorded"))
    api.put("jobsets", a_jobset())
    child = child_job(0)
    api.put("jobs", child)
    # A reconciler watches from the version it listed: it sees these whenever it starts.
    api.put("pods", failed_pod("uid-recorded", "recorded"))
    labels = {**JOBSET_LABELS, "jobset.sigs.k8s.io/restart-attempt": "0"}
    api.put("pods", failed_pod(child["metadata"]["uid"], child["metadata"]["name"], labels=labels))
    eventually(
        lambda: sum(1 for m, r, _ in api.writes if m == "PATCH" and r in ("jobs", "jobsets")) >= 2,
        10,
    )
    judged = {"RetryPolicyFailedJob"}
    eventually(lambda: sum(e.get("reason") in judged for e in stored_events(api)) == warnings, 10)
    # The failed pods' categories (webhook/controller/verdicts.py): their Events listed,
    # each pod's condition written, and said.
    classified = "RetryFailureClassified"
    eventually(lambda: any(e.get("reason") == classified for e in stored_events(api)), 10)
    # The budgets per cause: a disruption past max-disruptions (its Job read and written,
    # the pod marked), its peers marked, a pod replaced after its restarts in place, and
    # the Events that say so.
    from testkit.controllers import IN_PLACE, admitted_job
    from testkit.jobsim import JobRun

    budgets = {
        P + "ignore-disruptions": "true",
        P + "max-disruptions": "0",
        P + "peer-disruptions": "ignore",
    }
    run = JobRun.store(api, admitted_job(budgets, "budgets", parallelism=2, completions=2))
    pods = [run.new_pod() for _ in range(2)]
    replaced = JobRun.store(api, admitted_job(IN_PLACE, "restarts"))
    spent = replaced.restart(replaced.new_pod(), 5)
    run.disrupt(pods[0])
    eventually(lambda: replaced.current(spent)["spec"].get("activeDeadlineSeconds") == 1, 10)
    eventually(lambda: sum(1 for m, r, _ in api.writes if m == "PATCH" and r == "pods") >= 3, 10)
    eventually(lambda: any(m == "POST" and r == "events" for m, r, _ in api.writes), 10)
    # An audited Job that ends: its record marked told (a patch of the Job), its Event.
    from testkit.audits import audited_job, fail_until_ended

    fail_until_ended(JobRun.store(api, audited_job("audited")), 42)
    eventually(lambda: any(e.get("reason") == "RetryPolicyAudit" for e in stored_events(api)), 20)
    manager.stop.set()
    thread.join(scaled(10))
    worker, _ = recorder_for(
        api_client, "webhook-0", WORKLOADS
    )  # a worker's, as WorkerRuntime makes it
    regarding = Regarding("jobset.x-k8s.io/v1alpha2", "JobSet", "ml", "llama", "set-1")
    for _ in range(2):
        worker.emit(Event(regarding, "Normal", "RetryNodesAvoided", "attempt 2: keeping off"))
        assert worker.flush()
    assert worker.stats()["written"] == 1 and worker.stats()["aggregated"] == 1
    made = calls(list(api.requests))
    assert any(c.resource == "leases" and c.verb == "update" for c in made), made
    assert {c.resource for c in made if c.verb == "patch"} == {
        "jobs",
        "jobsets",
        "pods",
        "pods/status",
    }, made
    # A replaced pod is ended by its deadline (a patch of pods), never deleted.
    assert not any(c.resource == "pods" and c.verb == "delete" for c in made), made
    for verb, resource in (
        ("patch", "jobs"),
        ("patch", "jobsets"),
        ("create", "events"),
        ("update", "events"),
        ("get", "jobsets"),
        ("get", "cronjobs"),
        ("list", "pods"),
        ("list", "events"),
    ):
        assert any(c.verb == verb and c.resource == resource for c in made), (verb, resource)
    assert {("list", ""), ("watch", ""), ("patch", "ml")} <= {
        (c.verb, c.namespace) for c in made if c.resource == "pods"
    }, made
    docs = render(helm_path, {})
    account = deployment_pod(docs)["spec"]["serviceAccountName"]
    assert denied(docs, account, CHART_NS, made) == []
    assert api.refused == []
    # Its pod writes are the controller's (testkit/rbac.py), granted whatever the other
    # switches say.
    from testkit.rbac import POD_WRITES, combinations

    writes = {(c.verb, c.resource) for c in made if c.verb in ("patch", "delete", "update")}
    assert {w for w in writes if w[1].startswith("pods")} == POD_WRITES["controller"]
    for name, values, on in combinations():
        if "controller" in on:
            assert denied(render(helm_path, values), account, CHART_NS, made) == [], name
    # The check bites: a chart whose Lease is another would refuse this one.
    other = render(helm_path, {"controller": {"leaseName": "another"}})
    assert "update coordination.k8s.io/leases retry-policy-webhook-controller in " + (
        CHART_NS
    ) in denied(other, account, CHART_NS, made)
    # And for the reads of a failed Job's parents: a chart without JobSets and CronJobs.
    fewer = {"jobSets": False, "trainJobs": False, "cronJobs": False}
    refused = denied(render(helm_path, {"webhook": {"kinds": fewer}}), account, CHART_NS, made)
    assert "get jobset.x-k8s.io/jobsets llama in ml" in refused
    assert "get batch/cronjobs nightly in ml" in refused


def _find_helm() -> str:
    from testkit.tools import tool

    return tool("helm")


def test_without_a_cluster_the_controller_is_off_and_says_why(tmp_path):
    """No cluster connection: the controller process exits at once and stays off, and
    /readyz says why (not that it is restarting, which it never will)."""
    home = tmp_path / "home"  # no ~/.kube/config, no KUBECONFIG, not in a pod
    home.mkdir()
    lone = start(
        tmp_path / "certs",
        "--kube",
        "auto",
        log_path=tmp_path / "lone.log",
        env={"HOME": str(home), "KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""},
    )
    try:
        eventually(lambda: "controller off: no cluster connection" in lone.output(), 10)
        assert readyz(lone) == {"enabled": False, "reason": "no cluster connection"}
    finally:
        stop(lone)


@pytest.mark.slow  # a leader's threads, on the clock
def test_the_leader_runs_one_watch_of_jobs_for_every_reconciler(api, tmp_path):
    """The history recorder, the failed-Job judge, the audit reporter and the failure
    verdicts read Jobs through one shared watch (``webhook.controller.jobwatch``, as
    client-go's shared informers): a large cluster's Jobs are listed and streamed once, not
    four times."""
    from webhook.cluster.events import recorder_for
    from webhook.controller import reconcilers
    from webhook.controller.jobwatch import SharedJobs
    from webhook.kinds.registry import WORKLOADS

    path = write_kubeconfig(tmp_path / "kubeconfig-jobs", api.url)
    api_client = config.new_client_from_config(str(path))
    options = ControllerOptions(NS, "retry-policy-webhook-controller", "a", **STEADY)
    events, resolver = recorder_for(api_client, "a", WORKLOADS)
    built = reconcilers.build(api_client, options, events, resolver)
    (shared,) = [r for r in built if isinstance(r, SharedJobs)]
    readers = [r for r in built if getattr(r, "jobs", None) is shared]
    assert {r.name for r in readers} == {"history", "failed-jobs", "audits", "verdicts"}
    manager = Manager(client.CoordinationV1Api(api_client), options, built)
    thread = threading.Thread(target=manager.run, daemon=True)
    thread.start()
    try:
        assert manager.elector.leading.wait(scaled(5))
        eventually(lambda: shared.synced.is_set() and api.watcher_count("jobs") >= 1, 20)
        assert api.watcher_count("jobs") == 1
    finally:
        manager.stop.set()
        thread.join(scaled(15))
