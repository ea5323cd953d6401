"""The controller on the real API: one leader among replicas on a real Lease, handed over
when the leader dies, and the audit of defaults told in a ``RetryPolicyAudit`` Event once a
real Job fails."""

from __future__ import annotations

import json

from testkit import servers
from testkit.controlplane.harness import Kube, Served, eventually, job_manifest
from testkit.controlplane.webhook import LEASE

EXIT = "kubelet.retry-policy.dev/exit-code"
LEADER = "retry_webhook_controller_leader"


def holder(kube: Kube, served: Served) -> str:
    lease = kube.get("lease", LEASE, served.release.namespace) or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def leading(server: servers.Server) -> bool:
    return servers.metric(server.metrics(), LEADER) == 1


def test_one_replica_leads_and_a_standby_takes_over_when_it_dies(
    kube: Kube, webhook: Served, ns: str
):
    first = webhook.server
    eventually(lambda: holder(kube, webhook).startswith(webhook.identity), 60, "a leader")
    assert eventually(lambda: leading(first), 30, "the first replica leads")
    release = webhook.release
    standby = servers.start(
        release.cert_dir,
        *release.cluster_args(),
        metrics_port=servers.free_port(),
        log_path=release.directory / "standby.log",
        env=release.serve_env("standby"),
        preexec_fn=webhook.preexec,
    )
    try:
        assert not leading(standby)
        assert holder(kube, webhook).startswith(webhook.identity)
        servers.kill_group(first)  # the leader dies without a word: its Lease lapses
        eventually(lambda: holder(kube, webhook).startswith("standby"), 60, "the hand-over")
        assert eventually(lambda: leading(standby), 30, "the standby leads")
        # Admission back (the webhooks call the first replica's port); the new leader
        # is the one that releases a retry delay's gate.
        webhook.start()
        policy = {"retry-policy.dev/backoff-limit": "1", "retry-policy.dev/retry-delay": "2s"}
        kube.apply(job_manifest("handed", ns, policy, {EXIT: "1,0"}))
        kube.finished(ns, "handed", 90)
        assert kube.job_condition(ns, "handed", "Complete")
        released = "retry_webhook_retry_delay_gates_released_total"
        samples = standby.metrics()
        assert sum(v for (name, _), v in samples.items() if name == released) >= 1
        assert not leading(webhook.server)
    finally:
        servers.stop(standby)


def test_an_audited_default_is_told_in_an_event_when_a_real_job_fails(
    kube: Kube, served: Served, ns: str
):
    served.reconfigure(
        {
            "config": {
                "rollout": "audit",
                "defaults": {"fail-non-retriable": True, "backoff-limit": 3},
            }
        }
    )
    kube.apply(job_manifest("audited", ns, {}, {EXIT: "42"}, spec={"backoffLimit": 2}))
    job = kube.get("job", "audited", ns)
    assert job["metadata"]["labels"]["retry-policy.dev/managed"] == "audit"
    assert "podFailurePolicy" not in job["spec"], "audit changed the Job"
    record = json.loads(job["metadata"]["annotations"]["retry-policy.dev/audit"])
    assert record["settings"]["fail-non-retriable"] == "true"
    done = kube.finished(ns, "audited", 90)
    assert done["status"]["failed"] == 3

    def audit_event() -> dict | None:
        events = kube.list("events", ns)
        return next((e for e in events if e.get("reason") == "RetryPolicyAudit"), None)

    event = eventually(audit_event, 60, "the RetryPolicyAudit Event")
    assert event["involvedObject"]["name"] == "audited"
    assert "fail-non-retriable" in event["message"] and "saved" in event["message"]
