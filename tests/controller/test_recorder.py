"""A workload's disruption (or free-failure) counts and its failure history in one patch
of its record (``Disruptions``, ``FreeBudgets`` take the ``HistoryRecorder``'s pending pods
along): after a zone is lost, one patch per Job where there were two, the second refused
(409) as often as not.
Against the HTTP test API, with the real ``kubernetes`` client; the writers' turns are
taken by hand, so that which patch carries what is known."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from testkit.builders import P
from testkit.controllers import DISRUPTIONS, admitted_job, client_of, events_of, record_of
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JobRun
from testkit.servers import eventually
from webhook.cluster.events import EventRecorder, Regarding
from webhook.controller import recorder, writes
from webhook.controller.disruptions import Disruptions
from webhook.controller.freebudget import FreeBudgets
from webhook.controller.recorder import HistoryRecorder
from webhook.controller.records import Workloads, workload_of
from webhook.plan.causes import MAX_DISRUPTIONS_LABEL


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


class Writers:
    """The two writers of a Job's record, wired as the controller wires them, each turn
    taken by hand (``_running``, ``_pool``: as while the disruptions' loop runs)."""

    def __init__(self, api: FakeAPI, tmp_path, run: JobRun) -> None:
        client = client_of(api, tmp_path)
        self.events = EventRecorder(__import__("kubernetes").client.EventsV1Api(client), "test")
        self.api, self.run = api, run
        self.history = HistoryRecorder(client, window=0.05, events=self.events, linger=0.0)
        self.disruptions = Disruptions(client, self.events, None, window=0.05, history=self.history)
        self.disruptions._running = True
        self.disruptions._pool = ThreadPoolExecutor(1)
        self.history._apply_job("ADDED", run._job())

    def lose(self) -> dict:
        """A pod PodGC fails with DisruptionTarget, as both watches bring it."""
        pod = self.run.podgc(self.run.new_pod())
        self.history._apply_pod("MODIFIED", pod)
        self.disruptions._budget_event("MODIFIED", pod)
        self.count()
        return pod

    def count(self) -> None:
        """The disruptions' loop takes the pod queued first (``_take``: counts it)."""
        self.disruptions._take(*self.disruptions._queue.get_nowait(), self.disruptions._pool)

    def patches(self, since: int) -> int:
        with self.api.lock:
            calls = [call for call, _ in self.api.requests[since:]]
        return sum(1 for call in calls if call.startswith("PATCH /apis/batch"))

    def close(self) -> None:
        self.disruptions._pool.shutdown(wait=True)


@pytest.fixture
def writers(api, tmp_path):
    run = JobRun.store(api, admitted_job({**DISRUPTIONS, P + "backoff-limit": "3"}))
    found = Writers(api, tmp_path, run)
    yield found
    found.close()


def test_each_pods_count_and_history_go_in_one_patch(api, writers):
    """Two free disruptions and one over (the Job's backoffLimit lowered for it): the
    history leaves each pod to the disruptions' patch, which writes its mark with its
    count, three patches in all and none refused (before: six, and 409s)."""
    uids = []
    for _ in range(3):
        uids.append(writers.lose()["metadata"]["uid"])
        first = len(api.requests)
        writers.history.flush()
        assert writers.patches(first) == 0  # left to the disruptions' patch
        writers.disruptions.flush()
        assert writers.patches(first) == 1
        assert writers.history.waiting() == set()
    record = record_of(api, writers.run.uid)
    assert all(record.seen(uid) for uid in uids)  # the history of each
    assert record.disruptions_of() == 3
    assert record.late_lowered(uids[-1]) is True
    assert writers.run._job()["spec"]["backoffLimit"] == 2
    assert api.failed_writes == []
    assert writers.history.stats()["recorded"] == 3


def test_the_history_alone_goes_in_the_disruptions_patch(api, writers):
    """A pod of the Job that failed on its own, once the disruptions reconciler patches
    the Job's record: the disruptions' next patch carries it, though it counted nothing."""
    writers.lose()
    writers.disruptions.flush()
    failed = writers.run.fail(writers.run.new_pod(), code=1)
    writers.history._apply_pod("MODIFIED", failed)
    first = len(api.requests)
    writers.history.flush()
    assert writers.patches(first) == 0  # left to the disruptions' patch
    writers.disruptions.flush()
    assert writers.patches(first) == 1
    assert record_of(api, writers.run.uid).seen(failed["metadata"]["uid"])
    assert writers.history.waiting() == set()


def test_a_failure_no_attempt_learns_from_waits_to_ride_the_next_count(api, writers):
    """``LINGER_SECONDS``: a failed pod whose keys ask for no history (only ``status``, the
    waste and the audit read it, and not at once) is not written alone while it may
    wait: the Job's next disruption count carries it, one patch where there were two
    (an evicted pod's count at its eviction, its history at its failure a grace later)."""
    writers.history.linger = 60.0
    failed = writers.run.fail(writers.run.new_pod(), code=1)
    writers.history._apply_pod("MODIFIED", failed)
    first = len(api.requests)
    writers.history.flush()
    writers.disruptions.flush()
    assert writers.patches(first) == 0  # it lingers: nobody reads it at once
    assert writers.history.waiting() == set()  # (so no writer is asked to carry it)
    writers.lose()
    writers.disruptions.flush()
    assert writers.patches(first) == 1
    record = record_of(api, writers.run.uid)
    assert record.seen(failed["metadata"]["uid"]) and record.disruptions_of() == 1


def test_a_lingering_failure_is_written_when_due_and_at_a_stop(api, writers):
    """Past its linger a failure is written as any other (by the recorder, or by the
    writer that takes it); a stopping recorder writes what still lingers; a pod whose keys
    ask for history (a later attempt learns from it) does not linger at all."""
    history = writers.history
    history.linger = 60.0
    lingering = writers.run.fail(writers.run.new_pod(), code=1)
    history._apply_pod("MODIFIED", lingering)
    history.flush()
    assert record_of(api, writers.run.uid) is None
    history.flush(final=True)  # the recorder's last flush, when it stops
    assert record_of(api, writers.run.uid).seen(lingering["metadata"]["uid"])

    wanted = writers.run.fail(writers.run.new_pod(), code=1)
    wanted["metadata"].setdefault("annotations", {})[P + "avoid-failed-nodes"] = "true"
    history._apply_pod("MODIFIED", wanted)
    key = (wanted["metadata"]["namespace"], writers.run.uid)
    assert history.waiting() == {key}  # due at once
    history.flush()
    assert record_of(api, writers.run.uid).seen(wanted["metadata"]["uid"])

    due = writers.run.fail(writers.run.new_pod(), code=1)
    history._apply_pod("MODIFIED", due)
    assert history.waiting() == set()
    history.linger = 0.0  # (its time passed)
    assert history.waiting() == {key}
    history.flush()
    assert record_of(api, writers.run.uid).seen(due["metadata"]["uid"])


def test_a_patch_that_failed_gives_the_history_back_and_both_land_later(api, writers):
    """The API fails the patch (503): the disruptions wait for their back-off, the pods go
    back to the history, pending, and the next patch carries both once the API answers."""
    pod = writers.lose()
    api.write_status["jobs"] = 503
    writers.disruptions.flush()
    key = (pod["metadata"]["namespace"], writers.run.uid)
    assert writers.history.waiting() == {key}
    del api.write_status["jobs"]

    def landed() -> bool:
        writers.disruptions.flush()
        record = record_of(api, writers.run.uid)
        return record is not None and record.seen(pod["metadata"]["uid"])

    eventually(landed, 10)
    assert record_of(api, writers.run.uid).disruptions_of() == 1
    assert writers.history.waiting() == set()
    assert writers.history.stats()["recorded"] == 1


def test_the_history_writes_itself_when_the_disruptions_loop_is_not_running(api, writers):
    """The disruptions' loop stopped (or not started): nothing waits for its patch."""
    pod = writers.lose()
    writers.disruptions._running = False
    first = len(api.requests)
    writers.history.flush()
    assert writers.patches(first) == 1
    assert record_of(api, writers.run.uid).seen(pod["metadata"]["uid"])
    assert writers.history.waiting() == set()


def test_a_refused_patch_leaves_the_history_to_say_its_own_refusal(api, writers):
    """The API refuses the record (422): the disruptions give their count up with their
    Event; the history, given its pods back, writes them itself, is refused too, and says
    so in its own Event, as before the two shared a patch."""
    writers.lose()
    api.write_status["jobs"] = 422
    writers.disruptions.flush()
    writers.history.flush()
    eventually(lambda: len(events_of(api, writes.REASON)) == 2, 10)
    notes = sorted(e["note"] for e in events_of(api, writes.REASON))
    assert notes[0].startswith("the disruption count on Job ")
    assert notes[1].startswith("the failure history on Job ")
    assert writers.history.waiting() == set()


def test_the_history_waits_for_a_count_queued_before_its_workload_is_read(api, writers):
    """The Job's first disruption, queued and not counted yet (its budget state is read
    when it is): the history does not patch first, which would make the count's patch
    stale (409, a read and a patch more); the count's patch carries it."""
    pod = writers.run.podgc(writers.run.new_pod())
    writers.history._apply_pod("MODIFIED", pod)
    writers.disruptions._budget_event("MODIFIED", pod)
    first = len(api.requests)
    writers.history.flush()
    assert writers.patches(first) == 0
    writers.count()
    writers.disruptions.flush()
    assert writers.patches(first) == 1
    record = record_of(api, writers.run.uid)
    assert record.seen(pod["metadata"]["uid"]) and record.disruptions_of() == 1
    assert api.failed_writes == []


def test_a_queued_pod_with_no_budget_to_count_leaves_the_history_to_write_itself(api, writers):
    """A disrupted pod queued that counts against nothing (no max-disruptions on it): once
    it is taken, the Job is not the disruptions' to patch, and the history writes."""
    pod = writers.run.podgc(writers.run.new_pod())
    del pod["metadata"]["labels"][MAX_DISRUPTIONS_LABEL]
    writers.history._apply_pod("MODIFIED", pod)
    writers.disruptions._budget_event("MODIFIED", pod)
    writers.history.flush()
    assert writers.history.waiting() != set()  # it waits for the count
    writers.count()
    first = len(api.requests)
    writers.history.flush()
    assert writers.patches(first) == 1
    assert record_of(api, writers.run.uid).seen(pod["metadata"]["uid"])


def test_a_free_failures_count_and_its_history_go_in_one_patch(api, tmp_path):
    """max-free-failures: the free budget's patch carries the history's pods of its
    workload (while its owner's loop flushes it), one patch where there were two."""
    run = JobRun.store(
        api,
        admitted_job({P + "max-free-failures": "1", P + "free-categories": "DeviceFault"}, "free"),
    )
    client = client_of(api, tmp_path)
    history = HistoryRecorder(client, window=0.05, linger=0.0)
    free = FreeBudgets(Workloads(client), writes.Writes("free_budget"), history)
    free.running = True
    history._apply_job("ADDED", run._job())
    pods = [run.fail(run.new_pod(), code=1) for _ in range(2)]
    for pod in pods:
        history._apply_pod("MODIFIED", pod)
        assert free.decide(pod, workload_of(pod), 1) is not None
    first = len(api.requests)
    history.flush()
    with api.lock:
        assert not [c for c, _ in api.requests[first:] if c.startswith("PATCH")]
    free.flush()
    with api.lock:
        assert len([c for c, _ in api.requests[first:] if c.startswith("PATCH")]) == 1
    record = record_of(api, run.uid)
    assert [record.freed_as(p["metadata"]["uid"]) for p in pods] == ["free", "over"]
    assert all(record.seen(p["metadata"]["uid"]) for p in pods)
    assert history.waiting() == set() and api.failed_writes == []
    free.running = False  # its owner's loop ended: the history writes itself
    late = run.fail(run.new_pod(), code=1)
    history._apply_pod("MODIFIED", late)
    history.flush()
    assert record_of(api, run.uid).seen(late["metadata"]["uid"])


def test_an_unwritten_record_regards_its_workload():
    """A record that could not be written is told about on its workload: its Job, or the
    kind declared read whose record it is (a JobSet)."""
    job = recorder._Pending(("job", "ml", "job-uid"), "train")
    assert job.regarding() == Regarding("batch/v1", "Job", "ml", "train", "job-uid")
    jobset = recorder._Pending(("jobset", "ml", "set-uid"), "train")
    assert jobset.regarding() == Regarding(
        "jobset.x-k8s.io/v1alpha2", "JobSet", "ml", "train", "set-uid"
    )
