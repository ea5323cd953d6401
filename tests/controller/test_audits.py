"""``RetryPolicyAudit`` and the audit metrics: the real history recorder and audit reporter
against the HTTP test API, a Job admitted under ``rollout: audit`` (its real spec without
the audited settings, and what they would have been: ``retry-policy.dev/audit``) run by
the played Job controller and kubelet (``testkit/jobsim.py``) until it ends."""

from __future__ import annotations

import json
import threading

import pytest
from kubernetes import client as k8s

from testkit.audits import (
    ENDED,
    SAVED,
    audit_of,
    audited_job,
    audited_jobset,
    child_jobs,
    clock,
    end_jobset,
    fail_until_ended,
    restart,
)
from testkit.builders import P, job, stored
from testkit.controllers import admitted_job, client_of, events_of, record_of
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JobRun
from testkit.servers import eventually, scaled
from testkit.waste import MAIN
from webhook.cluster.events import EventRecorder
from webhook.cluster.record import Record
from webhook.controller.audits import REASON, AuditReporter
from webhook.controller.recorder import HistoryRecorder
from webhook.plan.audit import AUDIT
from webhook.serving.metrics import ControllerMetrics

#: What jobsim's attempts hold: a minute of MAIN's 2 cores, 4 GiB and a GPU.
PER_ATTEMPT = {"cpu": 120.0, "memory": 240.0, "nvidia.com/gpu": 60.0}


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


class Leader:
    """The leader's recorder and audit reporter, with real controller metrics and Events."""

    def __init__(self, fake: FakeAPI, tmp_path, grace: float = 60.0):
        self.client = client_of(fake, tmp_path)
        self.metrics = ControllerMetrics()
        self.events = EventRecorder(k8s.EventsV1Api(self.client), "test")
        self.recorder = HistoryRecorder(self.client, 0.05, metrics=self.metrics, linger=0.0)
        self.audits = AuditReporter(
            self.client, self.events, self.metrics, grace=grace, period=0.05
        )
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=r.run, args=(self.stop,), daemon=True)
            for r in (self.recorder, self.audits)
        ]

    def __enter__(self) -> Leader:
        for thread in self.threads:
            thread.start()
        for r in (self.recorder, self.audits):
            eventually(lambda r=r: getattr(r, "watches", None), 10)
            eventually(lambda r=r: all(w.synced.is_set() for w in r.watches), 10)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(scaled(5))
        self.events.flush()

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def test_an_audited_job_that_failed_is_told_what_the_defaults_would_have_saved(api, tmp_path):
    run = JobRun.store(api, audited_job())
    with Leader(api, tmp_path) as leader:
        fail_until_ended(run, 42)  # backoffLimit 2: the third failure ends it
        assert run.ended == "BackoffLimitExceeded"
        eventually(lambda: events_of(api, REASON), 10)
        (event,) = events_of(api, REASON)
        assert event["note"] == (
            "the defaults would have failed it at once on exit 42 (fail-non-retriable) after "
            "attempt 1 of 3: 2 attempts, 120 s, 240 core-seconds, 480 GiB-seconds and "
            "120 GPU-seconds saved"
        )
        assert event["regarding"]["uid"] == run.uid and event["type"] == "Normal"
        assert leader.sample(ENDED, namespace="ml", differed="true") == 1
        for resource, amount in PER_ATTEMPT.items():
            assert leader.sample(SAVED, namespace="ml", resource=resource) == 2 * amount
        assert record_of(api, run.uid).told
    told_once(api, tmp_path)


def told_once(api: FakeAPI, tmp_path, watches: int = 1) -> None:
    """A new leader (or this one restarted) lists the workload again (once its ``watches``
    have listed: JobSets are watched from their first child Job): told once, counted
    once."""
    with Leader(api, tmp_path) as successor:
        found = successor.audits.watches
        eventually(lambda: len(found) == watches and all(w.synced.is_set() for w in found), 10)
        eventually(lambda: successor.audits.stats()["waiting"] == 0, 10)
        successor.audits.flush()
        assert successor.audits.stats()["told"] == 0
        assert successor.sample(ENDED, namespace="ml", differed="true") == 0
    assert len(events_of(api, REASON)) == 1


def test_an_audited_job_that_completed_as_the_defaults_would_have_let_it(api, tmp_path):
    run = JobRun.store(api, audited_job("steady"))
    with Leader(api, tmp_path) as leader:
        run.fail(run.new_pod(), code=1)  # retriable under the defaults too
        run.succeed(run.new_pod())
        run.sync()
        assert run.ended == "Complete"
        run.conclude()
        eventually(lambda: events_of(api, REASON), 10)
        (event,) = events_of(api, REASON)
        assert event["note"] == (
            "nothing would have differed under the defaults: it completed after 1 failed "
            "attempt either way"
        )
        assert leader.sample(ENDED, namespace="ml", differed="false") == 1
        assert leader.sample(SAVED, namespace="ml", resource="cpu") == 0


def test_a_job_that_is_not_audited_is_not_told(api, tmp_path):
    """A Job with a plan of its own is recorded (its waste counted) without tries, and
    told nothing when it ends."""
    planned = admitted_job({P + "backoff-limit": "0"}, "planned")
    run = JobRun.store(api, planned)
    with Leader(api, tmp_path) as leader:
        fail_until_ended(run, 42)
        eventually(lambda: record_of(api, run.uid) is not None, 10)
        eventually(lambda: leader.audits.stats()["waiting"] == 0, 10)
        leader.audits.flush()
        assert leader.audits.stats()["told"] == 0
    recorded = record_of(api, run.uid)
    assert recorded.tries == () and not recorded.told
    assert events_of(api, REASON) == []


def cronjob_of(name: str) -> dict:
    audit = audit_of("spec.jobTemplate.spec")
    return stored(
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": name, "namespace": "ml", "annotations": {AUDIT: audit}},
            "spec": {"schedule": "@hourly", "jobTemplate": {"spec": {}}},
        },
        uid=f"uid-{name}",
    )


def test_a_cronjobs_job_is_told_from_the_cronjobs_audit(api, tmp_path):
    cron = cronjob_of("nightly")
    api.store("cronjobs", cron)
    made = stored(job(name="nightly-29000000", containers=[MAIN]), uid="uid-nightly-29000000")
    made["spec"]["backoffLimit"] = 2
    made["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "name": "nightly",
            "uid": "uid-nightly",
            "controller": True,
        }
    ]
    run = JobRun.store(api, made)
    with Leader(api, tmp_path):
        fail_until_ended(run, 42)
        eventually(lambda: events_of(api, REASON), 10)
        (event,) = events_of(api, REASON)
        assert event["note"].startswith(
            "the defaults would have failed it at once on exit 42 (fail-non-retriable) after "
            "attempt 1 of 3: 2 attempts"
        )
        assert event["regarding"]["name"] == "nightly-29000000"

    # ``retry-webhook status cronjob/nightly`` says it of the CronJob's Job too.
    from testkit.cli import run as cli
    from testkit.fakeapi import write_kubeconfig

    kubeconfig = str(write_kubeconfig(tmp_path / "kubeconfig-status", api.url))
    code, out, err = cli(["status", "cronjob/nightly", "-n", "ml", "--kubeconfig", kubeconfig])
    assert code == 0, err
    assert f"  - Job nightly-29000000: {event['note']}" in out
    # ``status job/nightly-29000000`` reads the CronJob's record for it (the CronJob
    # controller copies only the jobTemplate's metadata to its Jobs: getJobFromTemplate2,
    # pkg/controller/cronjob/utils.go), in one more GET, of the CronJob that controls it.
    api.requests.clear()
    code, out, err = cli(["status", "job/nightly-29000000", "-n", "ml", "--kubeconfig", kubeconfig])
    assert code == 0, err
    assert f"  - {event['note']}" in out
    reads = [path for path, _ in api.requests if path.startswith("/apis/batch/v1/")]
    assert [path for path in reads if "/cronjobs/" in path] == [
        "/apis/batch/v1/namespaces/ml/cronjobs/nightly"  # GET (others are "METHOD path")
    ]
    # A user who may not get CronJobs is told the rest, unchanged (exit 0, nothing unread).
    api.forbidden.add(("cronjobs", "nightly"))
    code, out, err = cli(["status", "job/nightly-29000000", "-n", "ml", "--kubeconfig", kubeconfig])
    assert (code, err) == (0, "")
    assert event["note"] not in out and "Could not read" not in out


def test_status_shows_what_the_event_says(api, tmp_path):
    """``retry-webhook status`` replays the same record against the same audit (in
    process, with the real client against the test API)."""
    from testkit.cli import run as cli
    from testkit.fakeapi import write_kubeconfig

    run = JobRun.store(api, audited_job("shown"))
    with Leader(api, tmp_path):
        fail_until_ended(run, 42)
        eventually(lambda: events_of(api, REASON), 10)
    (event,) = events_of(api, REASON)
    kubeconfig = str(write_kubeconfig(tmp_path / "kubeconfig-status", api.url))
    code, out, err = cli(["status", "job/shown", "-n", "ml", "--kubeconfig", kubeconfig])
    assert code == 0, err
    assert f"  - {event['note']}" in out
    assert out.index("Audited defaults (not enforced)") < out.index("Events from")
    code, out, _ = cli(
        ["status", "job/shown", "-n", "ml", "--kubeconfig", kubeconfig, "-o", "json"]
    )
    (line,) = json.loads(out)["audit"]
    assert line["sentence"] == event["note"] and line["differed"] == "true"
    assert line["saved"] == {k: 2 * v for k, v in PER_ATTEMPT.items()}


def test_a_job_whose_failures_were_never_recorded_is_told_after_the_grace(api, tmp_path):
    """Its failed pods went before any recorder saw them (a TTL, PodGC): the reporter waits
    for the record to hold what the Job controller counted, then tells what it knows."""
    gone = audited_job("gone")
    gone["status"] = {
        "failed": 3,
        "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}],
    }
    api.put("jobs", gone)
    with Leader(api, tmp_path) as waiting:
        eventually(lambda: waiting.audits.stats()["waiting"] == 1, 10)
        waiting.audits.flush()
        assert waiting.audits.stats()["told"] == 0  # a minute's grace
    with Leader(api, tmp_path, grace=0.0) as leader:
        eventually(lambda: events_of(api, REASON), 10)
        (event,) = events_of(api, REASON)
        assert event["note"] == (
            "what the defaults would have done is not known: they would not have ended it "
            "within the 0 failed attempts recorded, and 3 failed attempts never recorded, "
            "not replayed"
        )
        assert leader.sample(ENDED, namespace="ml", differed="unknown") == 1


def test_an_audited_jobset_is_told_on_the_jobset_once(api, tmp_path):
    """A JobSet admitted under audit, its child Jobs made as the JobSet controller makes
    them, restarted once: the recorder keeps its pods' tries on the JobSet (with their
    run), and once the JobSet ends the reporter tells it once, on the JobSet, as the
    metrics and ``retry-webhook status`` do.

    # upstream: failurePolicyRecreateAll, executeFailurePolicy (jobset
    # pkg/controllers/failure_policy.go): a failed child Job ends the run; a restart
    # deletes the run's child Jobs and makes new ones (getChildJobs: ``previous``)."""
    from testkit.cli import run as cli
    from testkit.fakeapi import write_kubeconfig

    jobset = api.store("jobsets", audited_jobset(failure_policy={"maxRestarts": 1}))
    uid = jobset["metadata"]["uid"]
    with Leader(api, tmp_path) as leader:
        children = child_jobs(api, jobset, 0)
        workers = children["workers"]
        for minute in (0, 2, 4):  # backoffLimit 2: the third failure fails it
            workers.clock = clock(minute, minute + 1)
            workers.fail(workers.new_pod(), code=42)
            workers.sync()
        workers.conclude()
        eventually(lambda: len((record_of(api, uid, "jobsets") or Record()).tries) == 3, 10)
        children = child_jobs(api, jobset, restart(api, uid, children))
        for child in children.values():
            child.succeed(child.new_pod())
            child.sync()
            child.conclude()
        end_jobset(api, uid, "Completed", "AllJobsCompleted")
        eventually(lambda: events_of(api, REASON), 10)
        (event,) = events_of(api, REASON)
        assert event["note"] == (
            "the defaults would have differed: in run 0 they would have failed Job "
            "pretrain-workers-0 at once on exit 42 (fail-non-retriable) after its attempt 1, "
            "ending the run earlier: 2 attempts, 120 s, 240 core-seconds, 480 GiB-seconds "
            "and 120 GPU-seconds saved; after run 0 the JobSet would have failed, though it "
            "completed (FailJobSetFailurePolicyAction: its rule retryPolicyFailNonRetriable "
            "(FailJobSet) on reason PodFailurePolicy of Job pretrain-workers-0), so run 1 "
            "would not have run: none of its failed attempts is recorded"
        )
        assert event["regarding"]["kind"] == "JobSet" and event["regarding"]["uid"] == uid
        assert leader.sample(ENDED, namespace="ml", differed="true") == 1
        for resource, amount in PER_ATTEMPT.items():
            assert leader.sample(SAVED, namespace="ml", resource=resource) == 2 * amount
        recorded = record_of(api, uid, "jobsets")
        assert recorded.told and [t.run for t in recorded.tries] == [0, 0, 0]
    told_once(api, tmp_path, watches=2)
    # The successor's recorder listed run 0's failed pods again: each is kept once.
    assert [t.run for t in record_of(api, uid, "jobsets").tries] == [0, 0, 0]
    kubeconfig = str(write_kubeconfig(tmp_path / "kubeconfig-status", api.url))
    code, out, err = cli(["status", "jobset/pretrain", "-n", "ml", "--kubeconfig", kubeconfig])
    assert code == 0, err
    assert f"  - {event['note']}" in out


def test_the_replay_judges_failure_categories(api, tmp_path):
    """An audited ``fail-categories: OOMKilled`` (the namespace's default, held back): the
    Job ran its three attempts, each OOM-killed; its record keeps each failure with its
    category (the recorder's, when the controller had not written it yet), and the replay
    judges the audited FailJob rule on it: the defaults would have ended it at once."""
    from testkit.audits import audit_config

    config = audit_config({"fail-categories": "OOMKilled", "backoff-limit": "2"})
    run = JobRun.store(api, audited_job("oom", config=config))
    with Leader(api, tmp_path):
        attempt = 0
        while not run.ended:
            run.clock = clock(2 * attempt, 2 * attempt + 1)
            pod = run.new_pod()

            def oom(p: dict) -> None:
                p["status"]["phase"] = "Failed"
                p["status"]["containerStatuses"][0]["state"] = {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "OOMKilled",
                        "startedAt": run.clock[0],
                        "finishedAt": run.clock[1],
                    }
                }

            run.update(pod, oom)
            run.sync()
            attempt += 1
        run.conclude()
        (event,) = eventually(lambda: events_of(api, REASON), 10)
        assert event["note"].startswith(
            "the defaults would have failed it at once on the pod condition "
            "retry-policy.dev/OOMKilled after attempt 1 of 3: 2 attempts"
        ), event["note"]
