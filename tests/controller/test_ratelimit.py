"""The controller's client-side rate limits (webhook/controller/ratelimit.py), as client-go's
token bucket (``flowcontrol.NewTokenBucketRateLimiter``: QPS tokens a second, at most Burst
saved, each request waiting for one), in two limiters so that bulk never delays critical."""

from __future__ import annotations

import threading

import pytest

from testkit.fakeapi import FakeAPI, write_kubeconfig
from webhook.controller.fence import Fence, fenced_client
from webhook.controller.ratelimit import (
    BULK,
    CRITICAL,
    Limits,
    Moot,
    TokenBucket,
    critical,
    limiter_for,
    unless,
    yields,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_burst_goes_at_once_and_the_rest_at_the_rate():
    clock = Clock()
    bucket = TokenBucket(10, 3, clock, clock.sleep)
    waits = [bucket.take() for _ in range(5)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3] == pytest.approx(0.1) and waits[4] == pytest.approx(0.1)
    clock.now += 10  # idle: the bucket fills again, up to its burst only
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.1)


def test_waiters_are_served_in_order():
    clock = Clock()
    bucket = TokenBucket(2, 1, clock, clock.sleep)
    assert [bucket.reserve() for _ in range(4)] == pytest.approx([0.0, 0.5, 1.0, 1.5])


def test_an_event_takes_only_a_token_no_other_request_reserved():
    """After a zone is lost, the records that count its pods go before the Events that
    tell of them: an Event waiting in the bulk bucket lets every request that comes
    meanwhile go first."""
    clock = Clock()
    bucket = TokenBucket(10, 1, clock, clock.sleep)
    records: list[float] = []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(records) < 3:  # a record's write comes while the Event waits
            records.append(bucket.reserve())

    bucket.sleep = sleep
    assert bucket.take() == 0.0  # the burst
    assert bucket.take(yielding=True) == pytest.approx(0.4)
    assert records == [0.0, 0.0, 0.0]  # each went first, at once
    clock.now += 10
    assert bucket.take(yielding=True) == 0.0  # nothing else waits: at once


@pytest.mark.parametrize(
    ("url", "event"),
    [
        ("https://api:6443/apis/events.k8s.io/v1/namespaces/ml/events", True),
        ("/apis/events.k8s.io/v1/namespaces/ml/events/train.3bd29db7c4d5280a", True),
        ("/api/v1/namespaces/ml/events", True),
        ("/apis/batch/v1/namespaces/ml/jobs/train", False),
        ("/apis/jobset.x-k8s.io/v1alpha2/namespaces/events/jobsets/events", False),
    ],
)
def test_only_events_yield(url, event):
    assert yields("POST", url) is event


@pytest.mark.parametrize(
    ("method", "url", "limiter"),
    [
        ("PATCH", "https://api:6443/api/v1/namespaces/ml/pods/train-x/status", CRITICAL),
        ("PATCH", "/api/v1/namespaces/ml/pods/train-x", CRITICAL),
        ("GET", "/api/v1/namespaces/ml/pods/train-x?resourceVersion=3", CRITICAL),
        ("GET", "/api/v1/pods?labelSelector=retry-policy.dev%2Fmax-disruptions&watch=true", BULK),
        ("GET", "/api/v1/namespaces/ml/pods?fieldSelector=metadata.name%3Dx", BULK),
        ("POST", "/apis/events.k8s.io/v1/namespaces/ml/events", BULK),
        ("PATCH", "/apis/batch/v1/namespaces/ml/jobs/train", BULK),
        ("PATCH", "/apis/batch/v1/namespaces/ml/jobs/train/status", CRITICAL),
        ("GET", "/apis/batch/v1/namespaces/ml/jobs/train", BULK),
    ],
)
def test_what_is_about_one_pod_is_critical(method, url, limiter):
    assert limiter_for(method, url) == limiter


def test_inside_critical_every_request_is_critical():
    """The read of a Job that its ``/status`` patch is computed from
    (``webhook.kinds.jobset.peers``) waits as the patch does; only on this thread."""
    job = "/apis/batch/v1/namespaces/ml/jobs/train"
    seen: list[str] = []
    with critical():
        seen.append(limiter_for("GET", job))
        other = threading.Thread(target=lambda: seen.append(limiter_for("GET", job)))
        other.start()
        other.join()
    assert seen == [CRITICAL, BULK]
    assert limiter_for("GET", job) == BULK


def test_bulk_work_never_delays_a_critical_request():
    clock = Clock()
    limits = Limits(1, 2, clock=clock, sleep=clock.sleep)
    for _ in range(10):
        limits.take("POST", "/apis/events.k8s.io/v1/namespaces/ml/events")
    waited_bulk = sum(clock.slept)
    assert waited_bulk == pytest.approx(8.0)
    assert limits.take("PATCH", "/api/v1/namespaces/ml/pods/p/status") == 0.0


def test_a_request_moot_once_its_token_came_is_not_sent_and_gives_the_token_back():
    """A mark computed for a pod before a wait of seconds is not sent if its pod ended
    meanwhile: ``Moot`` is raised instead, and the token goes to the next request. A
    request that did not wait is sent as computed."""
    clock = Clock()
    limits = Limits(1, 1, clock=clock, sleep=clock.sleep)
    pod = "/api/v1/namespaces/ml/pods/p/status"
    with unless(lambda: True):
        assert limits.take("PATCH", pod) == 0.0  # no wait: nothing can have changed
        with pytest.raises(Moot):
            limits.take("PATCH", pod)
    assert clock.slept == [pytest.approx(1.0)]
    assert limits.take("PATCH", pod) == 0.0  # the token given back
    with unless(lambda: False):
        assert limits.take("PATCH", pod) == pytest.approx(1.0)  # not moot: sent


def test_the_controller_s_client_waits_on_its_limiter_for_every_request(tmp_path):
    seen: list[str] = []
    api = FakeAPI().start()
    try:
        from kubernetes import client, config

        base = config.new_client_from_config(str(write_kubeconfig(tmp_path / "k", api.url)))
        fence = Fence()
        fence.extend(float("inf"))
        limits = Limits(1000, 1000, observe=lambda limiter, _: seen.append(limiter))
        acting = fenced_client(base.configuration, fence, limits)
        core = client.CoreV1Api(acting)
        core.list_namespaced_pod("ml")
        client.EventsV1Api(acting).list_namespaced_event("ml")
        with pytest.raises(client.ApiException):
            core.read_namespaced_pod("gone", "ml")  # waits, then is answered 404
    finally:
        api.stop()
    assert seen == [BULK, BULK, CRITICAL]
