"""Prometheus metrics, aggregated over every worker, on a plain-HTTP port.

The server runs several worker processes (and a supervisor), and a scrape reaches one
process only, so they record into ``prometheus_client``'s multiprocess files
(``PROMETHEUS_MULTIPROC_DIR``: ``webhook.serving.metricsdir``) and a small dedicated
exposition process (``python -m webhook.serving.metrics``, started by ``serve``)
reads all of them on each scrape. That process, not a thread in the supervisor, because
the supervisor forks workers for as long as it runs, and forking a process that has
threads risks deadlocks in the child. The supervisor binds the metrics port itself before
anything else starts, so a port that is taken fails the start with a clear error, and
hands the socket over.

Every label value is bounded: kinds are the registered ones (else ``other``),
annotations are the known keys, reasons are slugs. No user-controlled string ever
becomes a label (it could hold a secret, and it would explode the series count).

The multiprocess mode of ``prometheus_client`` is chosen when it is first imported, so
this module imports it lazily: ``metricsdir.prepare_multiprocess_dir`` must run before
``get``.
"""

from __future__ import annotations

import argparse
import bisect
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from http.server import ThreadingHTTPServer
from typing import Any

from webhook.serving.controllercounters import (
    AUDIT_DIFFERED,
    CATEGORY,
    CONDITION_RESULTS,
    CONDITIONS,
    UNCOVERED_REASONS,
    VERDICTS,
    audit_counters,
    budget_counters,
    failures_counter,
    wasted_counter,
)
from webhook.serving.metricsdir import ENV

log = logging.getLogger("webhook.metrics")  # also when run as __main__

PREFIX = "retry_webhook_"
#: Admission latency buckets (seconds): the API server's timeout is 1..30 s, our
#: budget is milliseconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: What retry policy did to objects (``Outcome.actions``): the label's only values.
#: Why the controller released a retry-delay gate (``webhook.controller.gates``).
GATE_RELEASES = ("due", "overdue", "no_time")
RETRY_ACTIONS = ("memory_raised", "nodes_avoided", "in_place_rules", "retry_delayed")


class Metrics:
    """Every metric of the webhook, recorded by the workers."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        # Our own registry: exposition in multiprocess mode reads the files, not this;
        # a private one also lets tests build several apps in one process.
        self.registry = CollectorRegistry()
        r = self.registry
        self.admission_duration = Histogram(
            PREFIX + "admission_duration_seconds",
            "Time to answer one admission request, by endpoint, kind and outcome "
            "(allowed, patched, denied, error, bad_request).",
            ["endpoint", "kind", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.mutations = Counter(
            PREFIX + "mutations_total",
            "Objects patched by the mutating webhook, once per retry-policy.dev annotation "
            "they carry (annotation=none: changed by admin defaults alone).",
            ["kind", "annotation"],
            registry=r,
        )
        self.denials = Counter(
            PREFIX + "denials_total",
            "Requests denied, once per distinct problem reason.",
            ["endpoint", "kind", "reason"],
            registry=r,
        )
        self.config_reloads = Counter(
            PREFIX + "config_reloads_total",
            "Config file changes seen by a worker, by result (success, failure: the last "
            "good config stays in force).",
            ["result"],
            registry=r,
        )
        self.config_reload_ok = Gauge(
            PREFIX + "config_last_reload_successful",
            "1 when every worker runs the config file as it is on disk, 0 when the file's "
            "latest version was refused.",
            multiprocess_mode="livemin",
            registry=r,
        )
        self.cert_expiry = Gauge(
            PREFIX + "certificate_expiry_timestamp_seconds",
            "Unix time when the serving certificate expires (the earliest one any worker "
            "serves). Alert when it is less than a few days away.",
            multiprocess_mode="livemin",
            registry=r,
        )
        self.cache_objects = Gauge(
            PREFIX + "attempt_cache_objects",
            "Objects in the attempt cache (jobs, failed_pods; failure_histories: Jobs or "
            "indexes whose failed pods' OOM kills and nodes are kept; "
            "limit_range_namespaces: namespaces with LimitRanges; nodes).",
            ["resource"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.cache_synced = Gauge(
            PREFIX + "attempt_cache_synced",
            "0 while a worker's attempt cache has not yet listed Jobs and failed pods "
            "(1 when synced, or when there is no cache: --kube off).",
            multiprocess_mode="livemin",
            registry=r,
        )
        self.cache_lookups = Counter(
            PREFIX + "attempt_cache_lookups_total",
            "Attempt lookups by result: hit (answered from the cache), miss (one bounded "
            "GET, or none while the API is failing).",
            ["result"],
            registry=r,
        )
        self.cache_errors = Counter(
            PREFIX + "attempt_cache_errors_total",
            "Attempt cache errors: fallback (a GET on a miss failed), breaker_skip (GET "
            "skipped after recent errors), watch (list/watch errors), history_list (a list "
            "of a Job's failed pods failed).",
            ["type"],
            registry=r,
        )
        self.retry_actions = Counter(
            PREFIX + "retry_actions_total",
            "What retry policy did: action=memory_raised counts containers given more "
            "memory after OOM kills, action=nodes_avoided the nodes a pod was kept off "
            "because earlier attempts failed there, action=in_place_rules the containers "
            "given a restart rule for in-place retries, action=retry_delayed the pods "
            "held back by a retry-delay gate.",
            ["action"],
            registry=r,
        )
        self.events = _events_counter(r)
        self._events_seen: dict[str, int] = {}
        self._cache_seen: dict[str, float] = {}
        self._deletions: Any = None
        self._deletions_seen: dict[str, int] = {}
        self._lock = threading.Lock()
        #: Latency observations not yet written: labels -> [sum, count per bucket...].
        self._timings: dict[tuple[str, str, str], list[float]] = {}
        self._bounds = (*LATENCY_BUCKETS, float("inf"))
        #: Counts not yet written to the shared files: (counter, labels, names) -> n.
        self._pending: dict[tuple[Any, tuple[str, ...], tuple[str, ...]], int] = {}
        self._pending_lock = threading.Lock()

    # --- the request path ---
    # Observations are added up in memory and written to the shared files by ``flush``
    # (the worker's maintenance loop, every second, and at exit): a request annotated with
    # six keys would otherwise pay eight locked writes to the memory-mapped files. A scrape
    # sees them at most a second late; a worker killed by SIGKILL loses that second's.
    def observe_admission(self, endpoint: str, kind: str, outcome: str, seconds: float) -> None:
        labels = (endpoint, kind, outcome)
        bucket = bisect.bisect_left(self._bounds, seconds) + 1  # as Histogram.observe: v <= le
        with self._pending_lock:
            timing = self._timings.get(labels)
            if timing is None:
                timing = self._timings[labels] = [0.0] * (len(self._bounds) + 1)
            timing[0] += seconds
            timing[bucket] += 1

    def count_mutation(self, kind: str, annotations: Iterable[str]) -> None:
        self._pend(self.mutations, (kind,), tuple(annotations) or ("none",))

    def count_denial(self, endpoint: str, kind: str, reasons: Iterable[str]) -> None:
        self._pend(self.denials, (endpoint, kind), tuple(reasons) or ("denied",))

    def count_retry_actions(self, actions: Iterable[tuple[str, int]]) -> None:
        """Failure-aware retries' actions, by count (only the known names: bounded)."""
        with self._pending_lock:
            for action, count in actions:
                if action in RETRY_ACTIONS:
                    key = (self.retry_actions, (), (action,))
                    self._pending[key] = self._pending.get(key, 0) + count

    def _pend(self, counter: Any, labels: tuple[str, ...], names: tuple[str, ...]) -> None:
        key = (counter, labels, names)
        with self._pending_lock:
            self._pending[key] = self._pending.get(key, 0) + 1

    def flush(self) -> None:
        """Write what was added up since the last flush to the shared files."""
        with self._pending_lock:
            pending, self._pending = self._pending, {}
            timings, self._timings = self._timings, {}
        for (counter, labels, names), count in pending.items():
            for name in sorted(set(names)):  # once per distinct annotation or reason
                counter.labels(*labels, name).inc(count)
        for labels, (total, *buckets) in timings.items():
            # A batch of observations at once: prometheus_client has no public call for
            # it, so this writes the child's sum and bucket values as ``observe`` does
            # (a test checks the exposition matches one ``observe`` per value).
            child = self.admission_duration.labels(*labels)
            child._sum.inc(total)
            for index, count in enumerate(buckets):
                if count:
                    child._buckets[index].inc(count)

    # --- reloads ---
    def config_reloaded(self, ok: bool) -> None:
        self.config_reloads.labels("success" if ok else "failure").inc()
        self.config_reload_ok.set(1 if ok else 0)

    def config_loaded(self) -> None:
        self.config_reload_ok.set(1)

    def certificate_served(self, not_after: float) -> None:
        self.cert_expiry.set(not_after)

    def sample_events(self, stats: Mapping[str, Any]) -> None:
        """The Event recorder's counts (``webhook.cluster.events``), sampled."""
        with self._lock:
            _sample_events(self.events, stats, self._events_seen)

    # --- pods disruptors deleted (webhook.cluster.deletions), sampled like the cache ---
    def sample_deletions(self, stats: Mapping[str, Any]) -> None:
        with self._lock:
            if self._deletions is None:
                self._deletions = _deletions_counter(self.registry)
            for result, total in stats.items():
                delta = int(total) - self._deletions_seen.get(result, 0)
                if delta > 0:
                    self._deletions.labels(result).inc(delta)
                self._deletions_seen[result] = int(total)

    # --- the attempt cache (sampled: its counters live in each worker's memory) ---
    def sample_cache(self, stats: Mapping[str, Any]) -> None:
        if not stats.get("enabled"):
            self.cache_synced.set(1)  # nothing to wait for
            return
        self.cache_objects.labels("jobs").set(stats.get("jobs", 0))
        self.cache_objects.labels("failed_pods").set(stats.get("failed_pods", 0))
        history = stats.get("history") or {}
        self.cache_objects.labels("failure_histories").set(history.get("lineages", 0))
        limit_ranges = stats.get("limit_ranges") or {}
        nodes = stats.get("nodes") or {}
        self.cache_objects.labels("limit_range_namespaces").set(limit_ranges.get("namespaces", 0))
        self.cache_objects.labels("nodes").set(nodes.get("nodes", 0))
        self.cache_synced.set(1 if stats.get("synced") else 0)
        counters = {
            (self.cache_lookups, "hit"): stats.get("hits", 0),
            (self.cache_lookups, "miss"): stats.get("misses", 0),
            (self.cache_errors, "fallback"): stats.get("fallback_errors", 0),
            (self.cache_errors, "breaker_skip"): stats.get("breaker_skips", 0),
            (self.cache_errors, "watch"): stats.get("watch_errors", 0)
            + limit_ranges.get("watch_errors", 0)
            + nodes.get("watch_errors", 0),
            (self.cache_errors, "history_list"): history.get("list_errors", 0),
        }
        with self._lock:
            for (counter, label), total in counters.items():
                key = f"{counter._name}/{label}"
                delta = total - self._cache_seen.get(key, 0)
                if delta > 0:
                    counter.labels(label).inc(delta)
                self._cache_seen[key] = total


def _events_counter(registry: Any) -> Any:
    from prometheus_client import Counter

    return Counter(
        PREFIX + "events_total",
        "Kubernetes Events about retry decisions, by result: written (a new Event), "
        "aggregated (a repeat counted into an existing Event's series), dropped (queue "
        "full, rate limit, or the API failing the write). From the workers and the "
        "controller.",
        ["result"],
        registry=registry,
    )


def _sample_events(counter: Any, stats: Mapping[str, Any], seen: dict[str, int]) -> None:
    """Add what an Event recorder counted since the last sample (its counters live in the
    process's memory; the metric's in the shared files)."""
    from webhook.cluster.events import RESULTS

    for result in RESULTS:
        total = int(stats.get(result, 0))
        delta = total - seen.get(result, 0)
        if delta > 0:
            counter.labels(result).inc(delta)
        seen[result] = total


def _certificate_reloads(registry: Any) -> Any:
    from prometheus_client import Counter

    return Counter(
        PREFIX + "certificate_reloads_total",
        "New versions of the serving certificate files, by result (success: served by "
        "every worker; failure: refused, the previous certificate is still served).",
        ["result"],
        registry=registry,
    )


class SupervisorMetrics:
    """What the supervisor records: certificate reloads (it alone watches the files).
    Nothing else, and no gauge: a ``live*`` gauge of the supervisor would hold the value
    it was created with next to the workers' own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.cert_reloads = _certificate_reloads(CollectorRegistry())

    def certificate_reloaded(self, ok: bool) -> None:
        self.cert_reloads.labels("success" if ok else "failure").inc()


class ControllerMetrics:
    """What the controller process records: whether it leads, and its reconcilers' work.
    Its gauges are ``liveall``: one series per controller process (pid), dropped when the
    process ends, so a scrape of a replica shows its current controller only.

    The counters the chart's alerts watch start at 0 for every label value they can take
    (all known in advance): a series that appeared at 1 would show no ``increase()``, and
    the first refused write or late condition would go unalerted."""

    def __init__(self, events: Callable[[], Mapping[str, Any]] | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.leading = Gauge(
            PREFIX + "controller_leader",
            "1 while this replica's controller holds the Lease and acts, 0 while it stands by.",
            multiprocess_mode="livemax",
            registry=self.registry,
        )
        self.events = _events_counter(self.registry)
        #: The controller's Event recorder's ``stats``, sampled at each flush.
        self._events_stats = events
        self._events_seen: dict[str, int] = {}
        self.pending = Gauge(
            PREFIX + "retry_delay_gates_pending",
            "Pods held back by a retry-delay scheduling gate, waiting for their not-before "
            "(counted by the leading controller).",
            multiprocess_mode="livemax",
            registry=self.registry,
        )
        self.released = Counter(
            PREFIX + "retry_delay_gates_released_total",
            "Retry-delay gates removed by the controller: reason=due (at its not-before), "
            "overdue (more than 10 s late: no leader meanwhile), no_time (no readable "
            "not-before: released at once).",
            ["reason"],
            registry=self.registry,
        )
        self._budget_counters = budget_counters(self.registry)
        self._wasted: Any = None
        self._audits: Any = None
        self._failures: Any = None
        self.writes = Counter(
            PREFIX + "controller_writes_total",
            "The controller's writes (writer: history, disruptions, gates, in_place, "
            "conditions), by result: written; conflict (409: read again and written again, "
            "never dropped); retried (429, 5xx or no answer: again after a back-off); "
            "refused (any other 4xx: given up, with a RetryPolicyWriteFailed Event).",
            ["writer", "result"],
            registry=self.registry,
        )
        self.unmarked_peers = Counter(
            PREFIX + "controller_peers_unmarked_total",
            "Peers of disrupted pods left without PeerDisrupted because one disruption had "
            "more of them than the controller's peer mark limit (--peer-mark-limit): their "
            "own rules decide their failures.",
            registry=self.registry,
        )
        self.ratelimit = Histogram(
            PREFIX + "controller_ratelimit_wait_seconds",
            "How long the controller's requests waited for their client-side rate limiter "
            "(webhook/controller/ratelimit.py): critical (pod conditions, gate releases, "
            "deadlines) or bulk (Events, records, lists and watches).",
            ["limiter"],
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self._zeros()

    def events_stats(self, events: Callable[[], Mapping[str, Any]]) -> None:
        """The Event recorder's ``stats``, sampled at each flush (made after the client)."""
        self._events_stats = events

    def ratelimit_wait(self, limiter: str, seconds: float) -> None:
        self.ratelimit.labels(limiter).observe(seconds)

    def _zeros(self) -> None:
        """Every series of the counters alerts watch, at 0 (see the class's doc)."""
        from webhook.controller.writes import RESULTS, WRITERS

        for writer in WRITERS:
            for result in RESULTS:
                self.writes.labels(writer, result)
        for reason in GATE_RELEASES:
            self.released.labels(reason)
        conditions, disruptions, _, uncovered = self._budget_counters
        for kind in (*CONDITIONS, CATEGORY):
            for result in CONDITION_RESULTS:
                conditions.labels(kind.removeprefix("retry-policy.dev/"), result)
        for result in ("free", "over"):
            disruptions.labels(result)
        for reason in UNCOVERED_REASONS:
            uncovered.labels(reason)
        from webhook.controller.ratelimit import LIMITERS

        for limiter in LIMITERS:
            self.ratelimit.labels(limiter)

    def leader(self, leading: bool) -> None:
        self.leading.set(1 if leading else 0)

    def wasted(self, namespace: str, cause: str, resource: str, amount: float) -> None:
        """What a failed attempt held (``webhook.cluster.waste``): counted once per pod, when
        its workload's record marks it. The labels are bounded: namespaces, the failure
        categories there are (the built-in ones and the config's), and the resources the
        cluster's nodes offer (a pod that ran was given each one it requested)."""
        if cause and amount > 0:
            if self._wasted is None:
                self._wasted = wasted_counter(self.registry)
            self._wasted.labels(namespace, cause, resource).inc(amount)

    def audited(self, namespace: str, differed: str, saved: Mapping[str, float]) -> None:
        """An audited workload ended (``webhook.controller.audits``), counted once: whether
        its defaults would have differed (true, false, unknown), and the resource-seconds
        they would have saved (``webhook.plan.replay``; memory in GiB-seconds)."""
        if differed not in AUDIT_DIFFERED:
            return
        if self._audits is None:
            self._audits = audit_counters(self.registry)
        ended, saved_counter = self._audits
        ended.labels(namespace, differed).inc()
        for resource, amount in sorted(saved.items()):
            if amount > 0:
                saved_counter.labels(namespace, resource).inc(amount)

    def gates_pending(self, count: int) -> None:
        self.pending.set(count)

    def gate_released(self, reason: str) -> None:
        if reason in GATE_RELEASES:
            self.released.labels(reason).inc()

    # --- budgets per cause (webhook.controller.disruptions, webhook.controller.restarts) ---
    def condition(self, kind: str, result: str) -> None:
        if (kind in CONDITIONS or kind == CATEGORY) and result in CONDITION_RESULTS:
            self._budget_counters[0].labels(kind.removeprefix("retry-policy.dev/"), result).inc()

    def failure(self, namespace: str, category: str, verdict: str) -> None:
        """A classified failure (``webhook.controller.verdicts``), counted once."""
        if verdict in VERDICTS and category:
            if self._failures is None:
                self._failures = failures_counter(self.registry)
            self._failures.labels(namespace, category, verdict).inc()

    def disruption(self, result: str) -> None:
        if result in ("free", "over"):
            self._budget_counters[1].labels(result).inc()

    def lowered(self) -> None:
        self._budget_counters[2].inc()

    def uncovered(self, reason: str) -> None:
        if reason in UNCOVERED_REASONS:
            self._budget_counters[3].labels(reason).inc()

    def peers_unmarked(self, count: int) -> None:
        self.unmarked_peers.inc(count)

    def write(self, writer: str, result: str) -> None:
        """A write's outcome (``webhook.controller.writes``)."""
        from webhook.controller.writes import RESULTS, WRITERS

        if writer in WRITERS and result in RESULTS:
            self.writes.labels(writer, result).inc()

    def flush(self) -> None:
        if self._events_stats is not None:
            _sample_events(self.events, self._events_stats(), self._events_seen)


def _deletions_counter(registry: Any) -> Any:
    from prometheus_client import Counter

    return Counter(
        PREFIX + "deletions_recognized_total",
        "Pods a disruptor deleted (config disruptors) that the webhook marked "
        "DisruptionTarget, by result: marked; late (the pod had already failed: the Job "
        "controller may have counted it); missed (already judged: not marked); gone, "
        "not_deleted, already (disrupted); dropped (queue full, or the API failing).",
        ["result"],
        registry=registry,
    )


_METRICS: Metrics | None = None
_METRICS_LOCK = threading.Lock()


def flush() -> None:
    """Flush this process's pending counts, if it records any (a worker at exit)."""
    if _METRICS is not None:
        _METRICS.flush()


def reset_after_fork() -> None:
    """In a process just forked from the supervisor: record into metrics of its own (the
    supervisor's object, its pending counts and its files stay the supervisor's)."""
    global _METRICS
    _METRICS = None


def get() -> Metrics:
    """This process's metrics (created on first use, after
    ``metricsdir.prepare_multiprocess_dir``)."""
    global _METRICS
    with _METRICS_LOCK:
        if _METRICS is None:
            _METRICS = Metrics()
        return _METRICS


def worker_exited(pid: int) -> None:
    """Drop a dead worker's ``live*`` gauges (its counters stay: totals never go back)."""
    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


# --- the exposition process -------------------------------------------------------------


def bind(host: str, port: int) -> socket.socket:
    """The metrics listening socket, bound by the master so a taken port fails the start."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(
            f"cannot listen for metrics on {host}:{port}: {err.strerror}; give "
            "--metrics-port a free port, or --metrics-port 0 to serve without metrics"
        ) from None
    sock.listen(16)
    sock.set_inheritable(True)
    return sock


def start_exposition(sock: socket.socket) -> Any:
    """Run ``python -m webhook.serving.metrics`` on ``sock``; it exits when this process does."""
    import subprocess

    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook.serving.metrics",
            "--fd",
            str(sock.fileno()),
            "--parent",
            str(os.getpid()),
        ],
        pass_fds=[sock.fileno()],
        env=dict(os.environ),
    )


def stop_exposition(proc: Any) -> None:
    import subprocess

    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()


class _SettledCollector:
    """``MultiProcessCollector``, tried again when a file is caught being created: a
    process that records its first value of a metric makes the file, then sizes it
    (``MmapedDict``), and a scrape in between reads an empty file (``struct.error``), which
    would fail the whole scrape."""

    def collect(self) -> Any:
        import struct
        import time

        from prometheus_client import multiprocess

        for attempt in range(5):
            try:
                return list(multiprocess.MultiProcessCollector(None).collect())
            except struct.error:
                if attempt == 4:
                    raise
                time.sleep(0.02)
        return []


def _serve(fd: int) -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import MetricsHandler

    registry = CollectorRegistry()
    registry.register(_SettledCollector())

    class Handler(MetricsHandler.factory(registry)):  # type: ignore[misc]
        def do_GET(self) -> None:
            if self.path.split("?")[0] in ("/metrics", "/"):
                super().do_GET()
            else:
                self.send_error(404, "only /metrics is served here")

        def log_message(self, *args: Any) -> None:
            pass  # scrapes are not worth a log line each

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = socket.socket(fileno=fd)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # lifeline: the server died
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("serving metrics", extra={"dir": os.environ.get(ENV)})
    while not stop.wait(1.0):
        pass
    server.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webhook.serving.metrics")
    parser.add_argument("--fd", type=int, required=True, help="listening socket to serve on")
    parser.add_argument("--parent", type=int, required=True, help="exit when this pid is gone")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    from webhook.serving import lifeline, logs

    lifeline.bind(args.parent)  # first: the imports and the set-up below take a while

    logs.setup(args.log_level)
    if not os.environ.get(ENV):
        log.error("%s is not set: nothing to serve", ENV)
        return 2
    _serve(args.fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
