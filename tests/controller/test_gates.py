"""Retry-delay gates end to end: the webhook gates a retry, the leading controller removes
the gate (ours only) when ``not-before`` comes, a controller that takes over releases
what is overdue, and ``retry-webhook release-gates`` releases them all.

Real parts: the controller's ``GateReleaser`` and the servers (``retry-webhook serve``,
two replicas electing a leader on the Lease) against the HTTP test API
(testkit/fakeapi/) with the real ``kubernetes`` client; every pod the webhook changes is
patched with the real ``kubectl patch --local`` and validated against the strict 1.35
and 1.36 schemas; the chart's RBAC (rendered by the real ``helm``) is checked against the
calls ``release-gates`` makes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.builders import decode_patch, review, stored
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.gates import (
    QUOTA,
    Running,
    a_job,
    admit_gated,
    core,
    fail,
    gate_names,
    gated_pod,
    new_pod,
    stored_pod,
)
from testkit.replicas import readyz, replica
from testkit.servers import eventually, free_port, metric, scaled, stop
from testkit.workloads import kubectl_patch, validate_schema
from webhook.controller.gates import GateReleaser, release_all
from webhook.kube import gates
from webhook.plan import delays as between
from webhook.policy.grammar import format_time, parse_time

BIN = Path(sys.executable).parent / "retry-webhook"
LEASE = "retry-policy-webhook-controller"
GAUGE = "retry_webhook_retry_delay_gates_pending"
RELEASED = "retry_webhook_retry_delay_gates_released_total"


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


class Recorded:
    def __init__(self) -> None:
        self.pending: list[int] = []
        self.released: list[str] = []

    def gates_pending(self, count: int) -> None:
        self.pending.append(count)

    def gate_released(self, reason: str) -> None:
        self.released.append(reason)


# --- the controller's releaser ---------------------------------------------------------------


@pytest.mark.slow  # waits for a not-before to come
def test_overdue_gates_go_at_once_others_on_time_and_only_ours(api, tmp_path):
    """A leader that starts (or returns) releases what is overdue at once; the rest when
    their not-before comes, never before; another controller's gate stays."""
    now = time.time()
    api.put("pods", gated_pod("overdue", now - 120))
    api.put("pods", gated_pod("soon", now + scaled(2)))  # not yet when the others go
    api.put("pods", gated_pod("elsewhere", now - 60, namespace="batch"))
    recorded = Recorded()
    with Running(GateReleaser(core(api, tmp_path), recorded)):
        eventually(lambda: gates.GATE not in gate_names(stored_pod(api, "uid-overdue")), 5)
        eventually(lambda: gates.GATE not in gate_names(stored_pod(api, "uid-elsewhere")), 5)
        assert gate_names(stored_pod(api, "uid-soon")) == [QUOTA["name"], gates.GATE]
        eventually(lambda: gates.GATE not in gate_names(stored_pod(api, "uid-soon")), 5, 0.02)
        released_at = time.time()
    due = parse_time(gates.not_before(stored_pod(api, "uid-soon")))
    assert due <= released_at < due + scaled(2.5)  # on time: not before, within a wait or two
    for uid in ("uid-overdue", "uid-soon", "uid-elsewhere"):
        obj = stored_pod(api, uid)
        assert gate_names(obj) == [QUOTA["name"]]  # Kueue's (or anyone's) gate stays
        assert gates.GATED_LABEL not in obj["metadata"]["labels"]
        assert gates.not_before(obj)  # kept: when it was let go, for people to read
        validate_schema(obj, "1.35")
        validate_schema(obj, "1.36")
    assert sorted(recorded.released) == ["due", "overdue", "overdue"]
    assert recorded.pending[-1] == 0


def test_a_pod_whose_gates_moved_meanwhile_is_read_again(api, tmp_path):
    """Another controller removes its gate between our read and our patch: the gate's
    index changed, the patch's test fails (422, as the API server's json-patch does) and
    the pod is read again; our gate goes, nothing else."""
    api.put("pods", gated_pod("moved", time.time() - 1))
    done = []

    def kueue_first(method, resource, name):
        if resource == "pods" and not done:
            done.append(name)
            obj = stored_pod(api, "uid-moved")
            obj["spec"]["schedulingGates"] = [{"name": gates.GATE}]
            api.put("pods", obj)

    api.before_write = kueue_first
    with Running(GateReleaser(core(api, tmp_path))) as releaser:
        eventually(lambda: releaser.released == 1, 5)
    assert ("PATCH", "moved", 422) in api.failed_writes
    obj = stored_pod(api, "uid-moved")
    assert gate_names(obj) == [] and gates.GATED_LABEL not in obj["metadata"]["labels"]


def test_a_gate_without_a_readable_time_goes_at_once(api, tmp_path):
    broken = gated_pod("broken", time.time() + 3600)
    broken["metadata"]["annotations"][gates.NOT_BEFORE] = "tomorrow"
    api.put("pods", broken)
    recorded = Recorded()
    with Running(GateReleaser(core(api, tmp_path), recorded)):
        eventually(lambda: gate_names(stored_pod(api, "uid-broken")) == [QUOTA["name"]], 5)
    assert recorded.released == ["no_time"]


# --- release-gates ----------------------------------------------------------------------------


def release_gates(fake: FakeAPI, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig-cli", fake.url)
    return subprocess.run(
        [str(BIN), "release-gates", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
        env={k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"},
    )


def test_release_gates_releases_them_all_and_says_so(api, tmp_path):
    later = time.time() + 3600
    for name, namespace in (("a", "ml"), ("b", "ml"), ("c", "batch")):
        api.put("pods", gated_pod(name, later, namespace))
    untouched = gated_pod("theirs", later)
    untouched["metadata"]["labels"] = {}
    untouched["spec"]["schedulingGates"] = [QUOTA]
    api.put("pods", untouched)
    assert release_gates(api, tmp_path).returncode == 2  # no scope: nothing guessed
    dry = release_gates(api, tmp_path, "-n", "ml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1] == "2 retry-delay gate(s) to release"
    assert gates.GATE in gate_names(stored_pod(api, "uid-a"))
    one_ns = release_gates(api, tmp_path, "-n", "ml")
    assert one_ns.returncode == 0, one_ns.stderr
    stamp = format_time(later)
    assert one_ns.stdout.splitlines() == [
        f"pod ml/a: released (not-before {stamp})",
        f"pod ml/b: released (not-before {stamp})",
        "2 retry-delay gate(s) released",
    ]
    assert gates.GATE in gate_names(stored_pod(api, "uid-c"))
    api.requests.clear()
    everywhere = release_gates(api, tmp_path, "--all-namespaces")
    assert everywhere.stdout.splitlines()[-1] == "1 retry-delay gate(s) released"
    for uid in ("uid-a", "uid-b", "uid-c"):
        assert gate_names(stored_pod(api, uid)) == [QUOTA["name"]]
    assert gate_names(stored_pod(api, "uid-theirs")) == [QUOTA["name"]]
    # Its calls, as RBAC reads them, are what the chart's delete hook may make.
    from testkit.chart import NAMESPACE, render
    from testkit.rbac import calls, denied
    from testkit.tools import tool

    made = calls(list(api.requests))
    assert {(c.verb, c.resource, c.namespace) for c in made} == {
        ("list", "pods", ""),
        ("patch", "pods", "batch"),
    }
    docs = render(tool("helm"), {})
    hook = "rpw-retry-policy-webhook-release-gates"
    assert denied(docs, hook, NAMESPACE, made) == []
    # The check bites: an identity the chart grants nothing is refused every call.
    assert denied(docs, "nobody", NAMESPACE, made) == sorted(str(c) for c in made)


def test_release_gates_reports_an_api_that_fails(api, tmp_path):
    api.put("pods", gated_pod("a", time.time()))
    api.fail_lists = 1
    failed = release_gates(api, tmp_path, "-A")
    assert failed.returncode == 1  # the API failed: run it again
    assert "Error: cannot list pods in all namespaces: HTTP 500 error" in failed.stderr


def test_release_gates_words_api_errors_as_status_does(api, tmp_path):
    """The same words as ``status`` (webhook/kube/apiclient.py); exit 2 for what running
    it again cannot fix: credentials that may not list pods, or no API at all."""
    api.forbidden.add(("pods", ""))
    refused = release_gates(api, tmp_path, "-n", "ml")
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert line.startswith("Error: cannot list pods in namespace ml: HTTP 403 forbidden: ")
    down = FakeAPI().start()
    down.stop()  # nothing listens at its address any more
    gone = release_gates(down, tmp_path, "-A")
    assert gone.returncode == 2
    assert "cannot list pods in all namespaces: the API server did not answer (" in gone.stderr
    assert "Traceback" not in refused.stderr + gone.stderr


def test_a_pod_deleted_between_list_and_patch_is_gone_not_an_error(api, tmp_path):
    api.put("pods", gated_pod("a", time.time()))
    api.before_write = lambda method, resource, name: api.delete("pods", "uid-a")
    done, errors = release_all(core(api, tmp_path), "ml")
    assert [(d.name, d.result) for d in done] == [("a", "gone")] and errors == []


# --- through the real servers -------------------------------------------------------------------


def store(fake: FakeAPI, made: dict, patch: list, tmp_path: Path) -> dict:
    """What the API server stores: the patch applied by Go's json-patch (kubectl), valid
    under the strict 1.35 and 1.36 schemas, then named and given a UID."""
    out = kubectl_patch(made, patch, tmp_path)
    for version in ("1.35", "1.36"):
        validate_schema(out, version)
    saved = stored(out)
    saved["status"] = {"phase": "Pending"}
    fake.put("pods", saved)
    return saved


def leader_of(servers: list) -> tuple:
    """The replica that leads, and the others, once every one sees the same holder."""
    holder = eventually(lambda: readyz(servers[0]).get("holder"), 15)
    for server in servers:
        eventually(lambda s=server: readyz(s).get("holder") == holder, 15)
    leader = next(s for s in servers if readyz(s)["leader"])
    return leader, [s for s in servers if s is not leader]


def test_a_retry_waits_as_asked_and_is_let_go_by_the_leader_or_its_successor(api, tmp_path):
    """Two replicas on the Lease. A Job pod of attempt 1 with retry-delay 2s is gated with
    not-before (its failure + 2s) and told its attempt; the leader removes our gate only,
    not before its time. Then the leader is killed mid-delay: the other replica takes the
    Lease and releases the overdue gate at once."""
    one = replica(tmp_path, api, "one")
    two = replica(tmp_path, api, "two")
    try:
        leader, (standby,) = leader_of([one, two])
        job = a_job("train")
        api.put("jobs", job)
        first = new_pod(job)
        fail(api, job, first, time.time())
        response, made, patch = admit_gated(standby, new_pod(job))
        gated = store(api, made, patch, tmp_path)
        due = gates.not_before(gated)
        assert due is not None
        warnings = response["warnings"]
        assert f"retry-policy: attempt 2 of 4 waits 2s after the failure: gated until {due}" in (
            warnings
        )
        assert between.env_in(gated["spec"]["containers"][0]) == {
            between.ATTEMPT: "1",
            between.MAX_ATTEMPTS: "4",
            between.LAST_FAILURE: "exit-code:2:main",
        }
        assert gate_names(gated) == [QUOTA["name"], gates.GATE]
        uid = gated["metadata"]["uid"]
        eventually(lambda: gates.GATE not in gate_names(stored_pod(api, uid)), 10, 0.02)
        assert time.time() >= parse_time(due)
        released = stored_pod(api, uid)
        assert gate_names(released) == [QUOTA["name"]]
        # The release, applied by Go's json-patch to the pod as it was, gives the same pod.
        by_kubectl = kubectl_patch(gated, gates.release_patch(gated), tmp_path)
        assert by_kubectl["spec"] == released["spec"]
        assert by_kubectl["metadata"]["labels"] == released["metadata"]["labels"]
        for version in ("1.35", "1.36"):
            validate_schema(released, version)

        # The leader dies mid-delay (SIGKILL: no release of the Lease, no last act), right
        # after it admitted the pod; its delay runs out before the standby takes over.
        job = a_job("again")
        api.put("jobs", job)
        fail(api, job, new_pod(job), time.time())
        _, made, patch = admit_gated(leader, new_pod(job))
        os.killpg(leader.proc.pid, signal.SIGKILL)
        leader.proc.wait(scaled(5))
        gated = store(api, made, patch, tmp_path)
        uid, due = gated["metadata"]["uid"], parse_time(gates.not_before(gated) or "")
        eventually(lambda: readyz(standby)["leader"], 15)
        eventually(lambda: gates.GATE not in gate_names(stored_pod(api, uid)), 10)
        assert gate_names(stored_pod(api, uid)) == [QUOTA["name"]]
        (line,) = [
            line
            for line in standby.logs()
            if line.get("msg") == "retry-delay gate released"
            and line.get("pod") == f"ml/{gated['metadata']['name']}"
        ]
        # Never before its time; late by how long the Lease took to lapse (0 when the
        # standby took over before the delay ran out: the lapse and the delay race here).
        assert line["late_seconds"] >= 0 and line["not_before"] == format_time(due)
    finally:
        for server in (one, two):
            if server.proc.poll() is None:
                stop(server)


def test_without_a_leader_a_retry_runs_at_once_with_a_warning(api, tmp_path):
    """A replica whose controller cannot take the Lease (the API refuses it): nobody
    would remove a gate, so none is added; the pod is told its attempt all the same."""
    api.forbidden.add(("leases", LEASE))
    lone = replica(tmp_path, api, "lone")
    try:
        state = eventually(lambda: readyz(lone) if readyz(lone).get("enabled") else None, 10)
        assert state["leaseLive"] is False and not state["leader"]
        job = a_job("unled")
        api.put("jobs", job)
        fail(api, job, new_pod(job), time.time())
        made = new_pod(job)

        def told():
            # The pod is told attempt 1 once the shared cache has seen the failure; until
            # then admission answers attempt 0, as it would in a cluster.
            response = lone.review("/mutate", review(made))["response"]
            patch = decode_patch({"response": response})
            if not patch:
                return None
            out = kubectl_patch(made, patch, tmp_path)
            attempt = between.env_in(out["spec"]["containers"][0]).get(between.ATTEMPT)
            return (response, out) if attempt == "1" else None

        response, out = eventually(told, 15)
        assert gate_names(out) == [QUOTA["name"]]  # ours was not added
        assert gates.NOT_BEFORE not in out["metadata"]["annotations"]
        assert gates.GATED_LABEL not in out["metadata"].get("labels", {})
        for version in ("1.35", "1.36"):
            validate_schema(out, version)
        assert (
            "retry-policy: attempt 2 of 4 not held back for its 2s retry-delay: no controller "
            "leads to end it"
        ) in response["warnings"]
        logged = [line for line in lone.logs() if line.get("msg") == "admission decision"]
        assert logged and not any(
            "retry_delayed" in (line.get("retry_actions") or {}) for line in logged
        )

        def warned():
            found = [
                e
                for (ns, _), e in api.named["events"].items()
                if ns == "ml" and e.get("reason") == "RetryDelaySkipped"
            ]
            return found or None

        # The worker writes it (no leader is needed for an Event), about the Job.
        (event,) = eventually(warned, 10)
        assert event["type"] == "Warning"
        assert event["regarding"]["kind"] == "Job" and event["regarding"]["name"] == "unled"
        assert event["reportingController"] == "retry-policy.dev/webhook"
        assert event["note"].startswith("attempt 2 of 4: not held back for its 2s retry-delay")
    finally:
        stop(lone)


def test_a_delayed_retry_is_logged_and_counted(api, tmp_path):
    """The gated admission's ``retry_actions`` in the decision log, and the controller's
    metrics in the replica's scrape: a gate pending, then released on time."""
    port = free_port()
    solo = replica(tmp_path, api, "solo", "--metrics-port", str(port))
    solo.metrics_port = port
    try:
        eventually(lambda: readyz(solo).get("leader"), 15)
        job = a_job("logged")
        api.put("jobs", job)
        fail(api, job, new_pod(job), time.time())
        _, made, patch = admit_gated(solo, new_pod(job))
        uid = store(api, made, patch, tmp_path)["metadata"]["uid"]

        def logged():
            lines = [line.get("retry_actions") for line in solo.logs()]
            return {"retry_delayed": 1} in lines

        eventually(logged, 5)
        eventually(lambda: metric(solo.metrics(), GAUGE) == 1, 5, 0.05)
        eventually(lambda: gates.GATE not in gate_names(stored_pod(api, uid)), 10)

        def counted():
            samples = solo.metrics()
            return metric(samples, RELEASED, reason="due") == 1 and metric(samples, GAUGE) == 0

        eventually(counted, 5)
    finally:
        stop(solo)
