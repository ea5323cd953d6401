"""A pod is gated only while gates are being released, not merely while a Lease is fresh.

The leader's ``GateReleaser`` tells whether its releases work (``health``); the leader
writes that on the Lease with each renewal and in its own note; a standby's controller,
reading the Lease anyway, passes it into its note; the admission workers read their note
and, when releases do not work, skip the gate with a warning and a ``RetryDelaySkipped``
Event. A release the API refuses (403, an admission webhook's 422) is given up with a
``RetryPolicyWriteFailed`` Event; one it fails (503) is tried again with back-off.

Against the HTTP test API with the real ``kubernetes`` client, and through two real
servers (``retry-webhook serve``) electing a leader on the Lease."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from kubernetes import client

from testkit.builders import apply, decode_patch, job_owner, review
from testkit.controllers import events_of
from testkit.delays import NOW, Source, job_pod
from testkit.fakeapi import FakeAPI
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
from testkit.replicas import NS, elector, lease, readyz, replica
from testkit.servers import eventually, stop
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.cluster import leadership
from webhook.cluster.events import EventRecorder
from webhook.cluster.leadership import LeaderState
from webhook.controller import gates as releaser_module
from webhook.controller.gates import GateReleaser
from webhook.controller.lease import ACQUIRING, GATES_ANNOTATION
from webhook.controller.writes import REASON
from webhook.kube import gates
from webhook.policy.config import parse_config


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def job_gated_pod(name: str, not_before: float) -> dict:
    """``gated_pod`` made by a Job: its Events regard the Job."""
    made = gated_pod(name, not_before)
    made["metadata"]["ownerReferences"] = [job_owner("train", "uid-train")]
    return made


def events_api(fake: FakeAPI, tmp_path: Path):
    return EventRecorder(client.EventsV1Api(core(fake, tmp_path).api_client), "test")


# --- admission --------------------------------------------------------------------------------


class Note:
    """A leadership note: a live Lease, and what the leader says of its releases."""

    def __init__(self, gates: str):
        self.gates = gates

    def read(self) -> LeaderState:
        t = leadership.wall()
        return LeaderState(enabled=True, holder="a", renewed_at=t, written_at=t, gates=self.gates)


def admitted(note: Note):
    source = Source(failures=1)
    made = job_pod()
    source.fail(made, NOW - 1)
    request = admission.decode(json.dumps(review(made)))
    verdict = engine.mutate(request, parse_config("{}"), source, leadership=note)
    return verdict, apply(made, verdict.patch)


def test_a_fresh_lease_whose_releases_fail_gates_nothing_and_says_why(monkeypatch):
    monkeypatch.setattr(leadership, "wall", lambda: NOW)
    verdict, out = admitted(Note("gate releases fail (HTTP 403)"))
    assert verdict.allowed and "schedulingGates" not in out["spec"]
    assert gates.GATED_LABEL not in out["metadata"].get("labels", {})
    assert (
        "retry-policy: attempt 2 of 7 not held back for its 30s retry-delay: the controller "
        "is not releasing gates now (gate releases fail (HTTP 403))"
    ) in verdict.warnings
    assert [reason for reason, _ in verdict.decisions] == ["RetryDelaySkipped"]
    verdict, out = admitted(Note(""))  # releases work: gated
    assert out["spec"]["schedulingGates"] == [{"name": gates.GATE}]
    assert [reason for reason, _ in verdict.decisions] == ["RetryDelayed"]


# --- the releaser's health ------------------------------------------------------------------


def test_a_release_the_api_refuses_is_told_once_and_stops_gating_for_a_while(api, tmp_path):
    """RBAC refuses the pod patches (403): the release is given up with a Warning Event on
    the Job, not tried again, and the releaser is not healthy until a release succeeds or
    ``COOLDOWN`` passes after the last failure."""
    api.put("pods", job_gated_pod("a", time.time() - 1))
    api.write_status["pods"] = 403
    offset = [0.0]
    releaser = GateReleaser(
        core(api, tmp_path),
        clock=lambda: time.time() + offset[0],
        events=events_api(api, tmp_path),
    )
    with Running(releaser):
        (event,) = eventually(lambda: events_of(api, REASON), 10)
        assert releaser.health() == "gate releases fail (HTTP 403)"
        # The pod changes (another controller's label): tried again, refused again.
        changed = stored_pod(api, "uid-a")
        changed["metadata"]["labels"]["team"] = "ml"
        api.put("pods", changed)
        eventually(lambda: len(api.failed_writes) == 2, 10)
        assert releaser.health().startswith("gate releases fail")
        offset[0] = releaser_module.COOLDOWN + 1  # a minute without a failure: gate again
        assert releaser.health() == ""
        offset[0] = 0.0
        del api.write_status["pods"]
        api.put("pods", job_gated_pod("b", time.time() - 1))
        eventually(lambda: gates.GATE not in gate_names(stored_pod(api, "uid-b")), 10)
        eventually(lambda: releaser.health() == "", 5)  # a release went through
    assert [code for _, _, code in api.failed_writes] == [403, 403]
    assert gate_names(stored_pod(api, "uid-a")) == [QUOTA["name"], gates.GATE]
    assert event["type"] == "Warning" and event["regarding"]["kind"] == "Job"
    assert event["note"].startswith(
        "the release of the retry-delay gate of pod ml/a not written: the API refused it (HTTP 403"
    )


def test_a_release_the_api_fails_is_tried_again_until_it_goes(api, tmp_path):
    api.put("pods", gated_pod("a", time.time() - 1))
    api.write_status["pods"] = 503
    releaser = GateReleaser(core(api, tmp_path))
    with Running(releaser):
        eventually(lambda: len(api.failed_writes) >= 2, 10)
        assert releaser.health() == "gate releases fail (HTTP 503)"
        del api.write_status["pods"]
        eventually(lambda: gates.GATE not in gate_names(stored_pod(api, "uid-a")), 10)
        eventually(lambda: releaser.health() == "", 5)  # once the release returned
    assert releaser.writes.stats()["retried"] >= 2 and releaser.writes.stats()["refused"] == 0


def test_a_broken_watch_of_gated_pods_is_no_release_to_gate_for(api, tmp_path):
    releaser = GateReleaser(core(api, tmp_path))
    assert releaser.health() == "the gated pods are not listed yet"
    with Running(releaser):
        eventually(lambda: releaser.health() == "", 10)
        api.forbidden.add(("pods", ""))
        api.expire("pods")  # the watch ends; the list it needs is refused
        eventually(lambda: releaser.health() == "the watch of gated pods fails (HTTP 403)", 10)
        api.forbidden.discard(("pods", ""))
        eventually(lambda: releaser.health() == "", 15)


def test_the_leader_says_it_on_the_lease_and_a_standby_reads_it(api, tmp_path):
    """What the leader's releaser says goes on the Lease with each renewal; a standby,
    which reads the Lease every retry period anyway, puts it in its own note."""
    # upstream: tryAcquireOrRenew (k8s.io/client-go tools/leaderelection/leaderelection.go)
    said = ["gate releases fail (HTTP 403)"]
    leader = elector(api, tmp_path, "one")
    leader.health = lambda: said[0]
    standby = elector(api, tmp_path, "two")
    assert leader.try_acquire_or_renew()
    # Taking the Lease vouches for nothing yet (it may land unanswered: a slow API).
    assert lease(api)["metadata"]["annotations"][GATES_ANNOTATION] == ACQUIRING
    assert not standby.try_acquire_or_renew()
    assert standby.state().gates == ACQUIRING
    leader.leading.set()
    assert leader.try_acquire_or_renew()  # its first renewal as the leader says it
    assert lease(api)["metadata"]["annotations"][GATES_ANNOTATION] == said[0]
    assert not standby.try_acquire_or_renew()
    assert standby.state().gates == said[0] and leader.state().gates == said[0]
    said[0] = ""
    assert leader.try_acquire_or_renew()
    assert lease(api)["metadata"]["annotations"][GATES_ANNOTATION] == "ok"
    assert not standby.try_acquire_or_renew()
    assert standby.state().gates == ""
    # A leader from before this says nothing on the Lease: its releases are taken to work.
    said[0] = "gate releases fail (HTTP 503)"
    assert leader.try_acquire_or_renew() and not standby.try_acquire_or_renew()
    assert standby.state().gates == said[0]
    with api.lock:
        stored = api.named["leases"][(NS, "retry-policy-webhook-controller")]
        del stored["metadata"]["annotations"]
        stored["spec"]["renewTime"] = "2026-11-26T10:00:00.000000Z"  # renewed
    assert not standby.try_acquire_or_renew()
    assert standby.state().gates == ""


# --- through the real servers -------------------------------------------------------------------


def test_a_standby_stops_gating_when_the_leaders_releases_are_refused(api, tmp_path):
    """Two replicas. The API refuses pod patches (403): the leader's first release fails
    and is given up with a RetryPolicyWriteFailed Event; from then on the standby's
    admission, told through the Lease, adds no gate and says why, with no request of its
    own."""
    one = replica(tmp_path, api, "one")
    two = replica(tmp_path, api, "two")
    try:
        holder = eventually(lambda: readyz(one).get("holder"), 15)
        eventually(lambda: readyz(two).get("holder") == holder, 15)
        standby = two if holder.startswith("one_") else one
        eventually(lambda: readyz(standby)["gateReleases"] == "ok", 15)
        api.write_status["pods"] = 403
        job = a_job("refused")
        api.put("jobs", job)
        fail(api, job, new_pod(job), time.time())
        _, made, patch = admit_gated(standby, new_pod(job))
        gated = apply(made, patch)
        gated["metadata"].update(name="refused-1", uid="uid-refused-1")
        gated["status"] = {"phase": "Pending"}
        api.put("pods", gated)
        (event,) = eventually(lambda: events_of(api, REASON), 15)
        assert event["regarding"]["name"] == "refused" and "HTTP 403" in event["note"]
        problem = eventually(lambda: (said := readyz(standby)["gateReleases"]) != "ok" and said, 15)
        assert problem == "gate releases fail (HTTP 403)"
        fail(api, job, new_pod(job), time.time())  # a second failure: its delay runs now
        made = new_pod(job)

        def told():
            response = standby.review("/mutate", review(made))["response"]
            said = [w for w in response.get("warnings", []) if "retry-delay" in w]
            # Until the shared cache sees the second failure, admission says attempt 2.
            return (response, said) if any("attempt 3 " in w for w in said) else None

        response, said = eventually(told, 15)
        assert response["allowed"] is True
        out = apply(made, decode_patch({"response": response}))
        assert gate_names(out) == [QUOTA["name"]]  # ours was not added
        assert said == [
            "retry-policy: attempt 3 of 4 not held back for its 2s retry-delay: the "
            f"controller is not releasing gates now ({problem})"
        ]
    finally:
        for server in (one, two):
            if server.proc.poll() is None:
                stop(server)
