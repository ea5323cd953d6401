"""The controller's writes the API refuses or fails (``webhook.controller.writes``): what
each answer means, the back-off, and the writers against the HTTP test API with the real
``kubernetes`` client: a refused write is given up with a Warning Event and never sent
again, a failing API is tried again with growing gaps until the write lands, and conflicts
are written through however many come in a row."""

from __future__ import annotations

import copy
import itertools
import time

import pytest
from kubernetes.client.exceptions import ApiException

from testkit.apivalidation import ANNOTATIONS_LIMIT
from testkit.controllers import (
    DISRUPTIONS,
    IN_PLACE,
    Counted,
    Running,
    admitted_job,
    counting_flushes,
    disruptions,
    events_of,
    in_place,
    preempt,
    record_of,
)
from testkit.jobsim import JobRun
from testkit.records import a_job, api_client, concurrent_writer, failed_pod, running, stored_job
from testkit.servers import eventually
from webhook.cluster.events import Event, EventRecorder, Regarding
from webhook.cluster.record import Record
from webhook.controller import writes
from webhook.controller.recorder import HistoryRecorder
from webhook.controller.writes import CONFLICT, GONE, REFUSED, TRANSIENT, Writes

JOB = Regarding("batch/v1", "Job", "ml", "train", "uid-train")


class Metrics(Counted):
    def write(self, writer: str, result: str) -> None:
        self.calls.append(("write", writer, result))


class Emitted:
    def __init__(self):
        self.events: list[Event] = []

    def emit(self, event: Event) -> bool:
        self.events.append(event)
        return True


def refusal(status: int | None, body: str = "", retry_after: str | None = None) -> Exception:
    if status is None:
        return ConnectionResetError("the connection dropped")
    err = ApiException(status=status, reason="refused")
    err.body = body
    err.headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return err


@pytest.fixture
def api():
    from testkit.fakeapi import FakeAPI

    fake = FakeAPI().start()
    yield fake
    fake.stop()


# --- what an answer means ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (409, CONFLICT),
        (429, TRANSIENT),
        (500, TRANSIENT),
        (503, TRANSIENT),
        (504, TRANSIENT),
        (None, TRANSIENT),
        (400, REFUSED),
        (403, REFUSED),
        (422, REFUSED),
        (404, GONE),
    ],
)
def test_what_an_answer_means_for_a_write(status, kind):
    """Only 429 among the 4xx can be taken later; any 5xx and no answer at all may be."""
    # upstream: checkWait (k8s.io/client-go rest/with_retry.go): 429 and 5xx are retried
    assert writes.outcome(refusal(status)) == kind


def test_the_back_off_doubles_up_to_its_cap_and_keeps_what_retry_after_asks():
    now = [100.0]
    tried = Writes("history", clock=lambda: now[0], first=0.5, cap=4.0)
    gaps = []
    for _ in range(5):
        assert tried.failed("w", refusal(503), JOB, "the history") is True
        gaps.append(tried.due("w") - now[0])
        assert not tried.ready("w")
    assert gaps == [0.5, 1.0, 2.0, 4.0, 4.0]
    # 429 with Retry-After: at least what the API asks (up to the cap).
    tried.failed("x", refusal(429, retry_after="3"), JOB, "the history")
    assert tried.due("x") - now[0] == 3.0
    now[0] += 3.0
    assert tried.ready("x")
    # A conflict waits the shortest back-off, whatever failed before; a write that lands
    # ends the back-off.
    tried.failed("w", refusal(409), JOB, "the history")
    assert tried.due("w") - now[0] == 0.5
    tried.landed("w")
    assert tried.ready("w") and tried.due("w") == now[0]
    assert tried.stats()["retried"] == 6 and tried.stats()["conflict"] == 1


def test_a_refused_write_is_given_up_with_a_warning_event_saying_what_and_why():
    events, metrics = Emitted(), Metrics()
    tried = Writes("disruptions", events, metrics)
    body = (
        '{"kind":"Status","code":422,"reason":"Invalid","message":"jobs \\"train\\" is '
        'invalid: metadata.annotations: Too long: may not be more than 262144 bytes"}'
    )
    what = "the disruption count on Job ml/train"
    assert tried.failed("w", refusal(422, body), JOB, what) is False
    (event,) = events.events
    assert (event.type, event.reason, event.regarding) == ("Warning", writes.REASON, JOB)
    assert event.note.startswith(f"{what} not written: the API refused it (HTTP 422")
    assert "metadata.annotations: Too long" in event.note and event.note.endswith("not retried")
    assert ("write", "disruptions", "refused") in metrics.calls
    assert tried.ready("w")  # nothing kept of it
    # Gone is no failure to tell: the object went away.
    assert tried.failed("g", refusal(404), JOB, "the history") is False
    assert len(events.events) == 1


# --- the disruption count ------------------------------------------------------------------


def near_the_annotation_limit(obj: dict) -> dict:
    """``obj`` with an annotation of its owner's that leaves less room than the record
    needs under the API's 256 KiB for all annotations together."""
    obj = copy.deepcopy(obj)
    annotations = obj["metadata"].setdefault("annotations", {})
    used = sum(len(k) + len(v) for k, v in annotations.items())
    annotations["example.com/notes"] = "x" * (ANNOTATIONS_LIMIT - used - 100)
    return obj


def test_a_disruption_count_the_api_refuses_is_told_once_and_never_sent_again(api, tmp_path):
    """A Job whose annotations leave no room for the record: the write is 422 Invalid.
    It is given up at once with a Warning Event on the Job, not sent five times a second."""
    # upstream: ValidateAnnotations, TotalAnnotationSizeLimitB (k8s.io/apimachinery
    # pkg/api/validation/objectmeta.go): 422 past 256 KiB of annotations
    run = JobRun.store(api, near_the_annotation_limit(admitted_job(DISRUPTIONS)))
    metrics = Metrics()
    reconciler = disruptions(api, tmp_path, metrics)
    flushes = counting_flushes(reconciler)
    with Running(reconciler):
        _, action = preempt(run, reconciler)
        assert action == "Ignore"  # the pod's own condition was written; only the count not
        (event,) = eventually(lambda: events_of(api, writes.REASON), 10)
        seen = len(flushes)
        eventually(lambda: len(flushes) >= seen + 20, 10)  # 20 more rounds of writes
        refused = [w for w in api.failed_writes if w[2] == 422]
        assert refused == [("PATCH", run.name, 422)]
    assert event["type"] == "Warning" and event["regarding"]["name"] == run.name
    assert event["note"].startswith(f"the disruption count on Job ml/{run.name} (1 disruptions")
    assert "HTTP 422" in event["note"] and "metadata.annotations: Too long" in event["note"]
    assert ("write", "disruptions", "refused") in metrics.calls
    assert record_of(api, run.uid) is None


# --- the failure history -----------------------------------------------------------------------


def failing_patches(fake, resource: str) -> list[float]:
    """When each PATCH of ``resource`` reached the API (this process's monotonic clock)."""
    times: list[float] = []

    def seen(method, kind, name):
        if method == "PATCH" and kind == resource:
            times.append(time.monotonic())

    fake.before_write = seen
    return times


@pytest.mark.slow  # real back-off and races: wall-clock time
def test_a_history_the_api_fails_is_tried_again_with_growing_gaps_until_it_lands(api, tmp_path):
    """An API failing every write (503): the failure stays pending, tried again after
    0.5 s, 1 s, 2 s...; once the API answers again it lands (before this change, one
    error dropped it)."""
    api.put("jobs", a_job())
    api.write_status["jobs"] = 503
    patches = failing_patches(api, "jobs")
    metrics = Metrics()
    recorder = HistoryRecorder(api_client(api, tmp_path), window=0.05, metrics=metrics, linger=0.0)
    stop, thread = running(recorder)
    try:
        api.put("pods", failed_pod("uid-train"))
        eventually(lambda: len(patches) >= 3, 15)
        del api.write_status["jobs"]
        job = eventually(lambda: (j := stored_job(api, "uid-train")) and Record.of(j) and j, 15)
    finally:
        stop.set()
        thread.join(5)
    assert Record.of(job).lineages[""].counted == 1
    gaps = [b - a for a, b in itertools.pairwise(patches)]
    assert all(gap >= 0.45 for gap in gaps), gaps  # never the 5-a-second of before
    assert gaps[1] >= 0.9  # and growing: 0.5 s, then 1 s
    assert ("write", "history", "retried") in metrics.calls
    assert ("write", "history", "written") in metrics.calls


def test_conflicts_however_many_in_a_row_never_drop_a_history(api, tmp_path):
    """Another writer changes the Job before each of the recorder's first twelve writes:
    each is 409, read again, recomputed and written again, until one lands."""
    api.put("jobs", a_job())
    conflicts = concurrent_writer(api, "uid-train", 12)
    recorder = HistoryRecorder(api_client(api, tmp_path), window=0.05, linger=0.0)
    stop, thread = running(recorder)
    try:
        api.put("pods", failed_pod("uid-train"))
        job = eventually(lambda: (j := stored_job(api, "uid-train")) and Record.of(j) and j, 15)
    finally:
        stop.set()
        thread.join(5)
    assert len(conflicts) == 12 and recorder.stats()["conflicts"] == 12
    assert job["metadata"]["labels"] == {"team": "t12"}  # the other writer's last change kept
    assert Record.of(job).lineages[""].counted == 1


def test_a_history_the_api_refuses_is_given_up_with_an_event_on_the_job(api, tmp_path):
    api.put("jobs", near_the_annotation_limit(a_job()))
    client = api_client(api, tmp_path)
    events = EventRecorder(__import__("kubernetes").client.EventsV1Api(client), "test")
    recorder = HistoryRecorder(client, window=0.05, events=events, linger=0.0)
    flushes = counting_flushes(recorder)
    stop, thread = running(recorder)
    try:
        api.put("pods", failed_pod("uid-train"))
        (event,) = eventually(lambda: events_of(api, writes.REASON), 10)
        seen = len(flushes)
        eventually(lambda: len(flushes) >= seen + 20, 10)
    finally:
        stop.set()
        thread.join(5)
    assert [w for w in api.failed_writes if w[2] == 422] == [("PATCH", "train", 422)]
    assert event["type"] == "Warning" and event["regarding"]["kind"] == "Job"
    assert event["note"].startswith("the failure history on Job ml/train (1 failed pods: train-")
    assert "later attempts do not learn from them" in event["note"]
    assert Record.of(stored_job(api, "uid-train")) is None


# --- the in-place budget ------------------------------------------------------------------------


def test_a_replacement_the_api_fails_is_tried_again_without_another_pod_event(api, tmp_path):
    """The pod reached max-in-place-restarts while the API failed pod writes (503): the
    replacement is tried again after its back-off, with no further change of the pod to
    bring it back (before, it waited for one that might never come)."""
    run = JobRun.store(api, admitted_job(IN_PLACE))
    api.write_status["pods"] = 503
    metrics = Metrics()
    with Running(in_place(api, tmp_path, metrics)):
        pod = run.new_pod()
        run.restart(pod, 5)
        eventually(lambda: len(api.failed_writes) >= 2, 10)
        del api.write_status["pods"]
        eventually(lambda: run.current(pod)["spec"].get("activeDeadlineSeconds") == 1, 10)
    assert ("write", "in_place", "retried") in metrics.calls
    assert ("write", "in_place", "written") in metrics.calls


def test_a_replacement_the_api_refuses_is_told_and_not_sent_again(api, tmp_path):
    run = JobRun.store(api, admitted_job(IN_PLACE))
    api.write_status["pods"] = 403
    reconciler = in_place(api, tmp_path)
    with Running(reconciler):
        pod = run.new_pod()
        run.restart(pod, 5)
        (event,) = eventually(lambda: events_of(api, writes.REASON), 10)
    assert [code for _, _, code in api.failed_writes] == [403]
    assert event["regarding"]["name"] == run.name and "HTTP 403" in event["note"]
    assert event["note"].startswith(f"the replacement of pod {pod['metadata']['name']}")
    assert "activeDeadlineSeconds" not in run.current(pod)["spec"]
