"""Kubeflow Trainer runtimes: the templates TrainJobs' JobSets are made from, as the server
watches them (``RuntimeCache``) and the CLI is given them (``GivenRuntimes``); both answer
``webhook.cluster.runtimes.RuntimeSource``, which a TrainJob's admission consults.

A TrainJob (trainer.kubeflow.org/v1alpha1) names a TrainingRuntime (in its namespace) or a
ClusterTrainingRuntime in ``spec.runtimeRef``, and the trainer controller builds its
JobSet from that runtime's ``spec.template``. Whether the policy annotated on a TrainJob
can work (a ``backoff-limit`` against the runtime's ``maxRestarts``, ``fail-non-retriable``
against a template's ``restartPolicy``, a runtime's own failurePolicy rules) depends on the
runtime, and the user should learn it on ``kubectl apply`` of the TrainJob: a denial of the
JobSet the controller creates later shows only as an Event on the TrainJob, and the
controller retries it forever.

How the trainer builds that JobSet changed between releases (Trainer v2.3 merges a
TrainJob's ``resourcesPerNode`` into the runtime's resources, v2.2 replaced them), so the
cache also learns the Trainer's release from the ConfigMap Trainer publishes it in
(``kubeflow-trainer-public``, readable by every authenticated user), polled in the
background; without it a TrainJob is judged as both releases would build its JobSet.

So the server reads runtimes from a watch-backed cache (``RuntimeCache``: one list, then a
watch, per kind), never with a request per admission, except one bounded GET when a
runtime is missing from the cache (created a moment before the TrainJob, its watch event
not yet arrived). The cache starts with the first TrainJob it is asked about, so a cluster
without the Trainer never lists runtimes. When the API cannot answer, a lookup says why
and the TrainJob is admitted on what it says alone, with a warning: the JobSet's own
admission checks the rest (failing open, like the attempt cache). The CLI reads runtimes
given in the same input (``GivenRuntimes``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.cluster.informer import Informer, Informers
from webhook.cluster.runtimes import (
    CLUSTER_KIND,
    PLURALS,
    VERSION,
    RuntimeLookup,
    describe,
    runtime_key,
)
from webhook.kube.wellknown import TRAINER_GROUP

log = logging.getLogger(__name__)

#: Where Kubeflow Trainer says which release it is: a ConfigMap in its own namespace, with
#: a Role and a RoleBinding that let ``system:authenticated`` get it (v2.2.0 and v2.3.0:
#: ``configMapGenerator`` in manifests/overlays/manager/kustomization.yaml; the Helm chart's
#: templates/manager/public-configmap.yaml and templates/rbac/public_configmap_role*.yaml).
TRAINER_CONFIGMAP = "kubeflow-trainer-public"
TRAINER_VERSION_KEY = "kubeflow_trainer_version"
#: The namespaces Trainer's manifests install it in: its own overlay's, the Kubeflow
#: platform's (manifests/overlays/kubeflow-platform).
TRAINER_NAMESPACES = ("kubeflow-system", "kubeflow")
#: How often the Trainer's release is read again (an upgrade changes it).
TRAINER_POLL_SECONDS = 300.0


def is_runtime(obj: Mapping[str, Any]) -> bool:
    api_version = str(obj.get("apiVersion") or "")
    return api_version.rpartition("/")[0] == TRAINER_GROUP and obj.get("kind") in PLURALS


def trainer_version_of(obj: Mapping[str, Any]) -> str | None:
    """The release in Trainer's public ConfigMap, when ``obj`` is it."""
    meta = _dict(obj.get("metadata"))
    if obj.get("kind") != "ConfigMap" or meta.get("name") != TRAINER_CONFIGMAP:
        return None
    value = _dict(obj.get("data")).get(TRAINER_VERSION_KEY)
    return value if isinstance(value, str) and value else None


class GivenRuntimes:
    """The runtimes among a set of objects (the documents of one CLI input), and the
    Trainer's release when ``trainer`` says it or its public ConfigMap is among them."""

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]],
        namespace: str | None = None,
        trainer: str | None = None,
    ):
        self._runtimes: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        self.trainer = trainer
        for obj in objects:
            if is_runtime(obj):
                meta = _dict(obj.get("metadata"))
                ns = meta.get("namespace") or namespace or "default"
                key = runtime_key(str(obj["kind"]), ns, str(meta.get("name") or ""))
                self._runtimes[key] = obj
            elif trainer is None and trainer_version_of(obj) is not None:
                self.trainer = trainer_version_of(obj)

    def runtime(self, kind: str, namespace: str | None, name: str) -> RuntimeLookup:
        found = self._runtimes.get(runtime_key(kind, namespace, name))
        if found is not None:
            return RuntimeLookup(found, trainer=self.trainer)
        return RuntimeLookup(
            None,
            f"{describe(kind, namespace, name)} is not in the input (give it in the same "
            "file to check the TrainJob against it)",
            trainer=self.trainer,
        )

    def stats(self) -> dict[str, Any]:
        return {"enabled": True, "runtimes": len(self._runtimes), "trainerVersion": self.trainer}


def slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the policy reads of a runtime: its identity and ``spec.template`` (kept
    small: the cache holds every runtime of the cluster)."""
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    out: dict[str, Any] = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind")}
    out["metadata"] = kept
    # mlPolicy: node counts, and MPI's runLauncherAsNode (which Jobs get resourcesPerNode).
    out["spec"] = {k: spec[k] for k in ("mlPolicy", "template") if k in spec}
    return out


class _TrainerRelease:
    """Trainer's release from its public ConfigMap: one GET per candidate namespace, again
    every ``period`` seconds (run by ``Informers`` like an informer). Not a watch: only the
    namespace Trainer is installed in grants it, and a watch elsewhere would fail forever.
    A namespace that answers 403 or 404 is not Trainer's; another error keeps what was
    known."""

    name = "trainer-version"

    def __init__(
        self,
        core_api: Any,
        namespaces: tuple[str, ...],
        stop: threading.Event,
        period: float = TRAINER_POLL_SECONDS,
        timeout: float = 2.0,
    ):
        self.core_api = core_api
        self.namespaces = namespaces
        self.stop = stop
        self.period = period
        self.timeout = timeout
        self.synced = threading.Event()
        self.errors = 0
        self.version: str | None = None
        self.last_error = ""

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.synced.set()
            self.stop.wait(self.period)

    def poll(self) -> None:
        failed = False
        for namespace in self.namespaces:
            try:
                resp = self.core_api.read_namespaced_config_map(
                    TRAINER_CONFIGMAP,
                    namespace,
                    _preload_content=False,
                    _request_timeout=self.timeout,
                )
                version = trainer_version_of({**json.loads(resp.data), "kind": "ConfigMap"})
            except Exception as err:  # the poller must survive anything the API does
                if getattr(err, "status", None) not in (403, 404):
                    failed = True
                    self.errors += 1
                    self.last_error = _short(err)
                continue
            if version is not None:
                self.version = version
                self.last_error = ""
                return
        if not failed:
            self.version = None


class RuntimeCache(Informers):
    """Watch-backed (Cluster)TrainingRuntimes, started by the first lookup."""

    def __init__(
        self,
        custom_api: Any,
        lookup_timeout: float = 0.5,
        breaker_seconds: float = 10.0,
        core_api: Any = None,
        trainer_namespaces: tuple[str, ...] = TRAINER_NAMESPACES,
        trainer_poll_seconds: float = TRAINER_POLL_SECONDS,
    ):
        super().__init__()
        self.custom_api = custom_api
        self.lookup_timeout = lookup_timeout
        self.breaker_seconds = breaker_seconds
        self._lock = threading.Lock()
        self._runtimes: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._open_until = 0.0
        self._errors: dict[str, str] = {}
        self._counters = {"hits": 0, "misses": 0, "fallback_errors": 0, "breaker_skips": 0}
        self._informers = [
            Informer(
                plural,
                self._recording(plural, functools.partial(self._list, plural)),
                functools.partial(self._reset, kind),
                functools.partial(self._apply, kind),
                {},
                self._stop,
                label="runtime cache",
            )
            for kind, plural in PLURALS.items()
        ]
        self._release: _TrainerRelease | None = None
        if core_api is not None:
            self._release = _TrainerRelease(
                core_api, trainer_namespaces, self._stop, trainer_poll_seconds
            )
            self._informers.append(self._release)  # duck-typed: name, run, synced, errors

    @classmethod
    def of(cls, clients: tuple[Any, ...], lookup_timeout: float = 0.5) -> RuntimeCache:
        """A runtime cache on the attempt cache's API access (``attempts.connect``: the
        batch and core APIs)."""
        from kubernetes import client

        return cls(
            client.CustomObjectsApi(clients[0].api_client), lookup_timeout, core_api=clients[1]
        )

    @property
    def trainer(self) -> str | None:
        return self._release.version if self._release is not None else None

    def _release_pending(self) -> bool:
        """Whether the first read of the Trainer's release may still come in time for a
        lookup (within a lookup_timeout of the cache's start)."""
        return (
            self._release is not None
            and not self._release.synced.is_set()
            and time.monotonic() < self._started_at + self.lookup_timeout
        )

    def _list(self, plural: str, **kwargs: Any) -> Any:
        return self.custom_api.list_cluster_custom_object(TRAINER_GROUP, VERSION, plural, **kwargs)

    def _recording(self, plural: str, list_fn: Any) -> Any:
        """``list_fn``, remembering its last failure (a lookup says why it knows nothing)."""

        def call(**kwargs: Any) -> Any:
            try:
                answer = list_fn(**kwargs)
            except Exception as err:
                self._errors[plural] = _short(err)
                raise
            self._errors.pop(plural, None)
            return answer

        return call

    # --- store updates (informer threads) --------------------------------------------
    def _reset(self, kind: str) -> None:
        with self._lock:
            for key in [k for k in self._runtimes if k[0] == kind]:
                del self._runtimes[key]

    def _apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        meta = _dict(obj.get("metadata"))
        key = runtime_key(kind, meta.get("namespace"), str(meta.get("name") or ""))
        with self._lock:
            if event == "DELETED":
                self._runtimes.pop(key, None)
            else:
                self._runtimes[key] = slim({**obj, "kind": kind})

    # --- lookups -----------------------------------------------------------------------
    def runtime(self, kind: str, namespace: str | None, name: str) -> RuntimeLookup:
        answer = self.answer_at_once(kind, namespace, name)
        if answer is not None:
            return answer
        informer = self._informers[list(PLURALS).index(kind)]
        # Only the first lookups wait for the first list (a lookup_timeout from the start):
        # an informer that cannot list must not slow every admission down.
        informer.synced.wait(max(0.0, self._started_at + self.lookup_timeout - time.monotonic()))
        if self._release is not None:
            self._release.synced.wait(
                max(0.0, self._started_at + self.lookup_timeout - time.monotonic())
            )
        with self._lock:
            found = self._runtimes.get(runtime_key(kind, namespace, name))
        if found is not None:
            self._counters["hits"] += 1
            return RuntimeLookup(found, trainer=self.trainer)
        self._counters["misses"] += 1
        return dataclasses.replace(self._fallback(kind, namespace, name), trainer=self.trainer)

    def answer_at_once(self, kind: str, namespace: str | None, name: str) -> RuntimeLookup | None:
        """The answer when it needs no request to the API nor a wait (the runtime in the
        cache, the breaker open, a kind that is no runtime's); ``None`` when it needs the
        cache's first list or the bounded GET, which ``runtime`` does. Starts the cache."""
        if kind not in PLURALS:
            return RuntimeLookup(None, f"{kind} is not a Kubeflow Trainer runtime kind")
        if not self.started:
            self.start()
        with self._lock:
            found = self._runtimes.get(runtime_key(kind, namespace, name))
        if found is not None and self._release_pending():
            return None  # worth a short wait for the Trainer's release
        if found is not None:
            self._counters["hits"] += 1
            return RuntimeLookup(found, trainer=self.trainer)
        if time.monotonic() < self._open_until:
            self._counters["misses"] += 1
            self._counters["breaker_skips"] += 1
            what = describe(kind, namespace, name)
            return RuntimeLookup(
                None, f"{what} unreadable: Kubernetes API unavailable", trainer=self.trainer
            )
        return None

    def _fallback(self, kind: str, namespace: str | None, name: str) -> RuntimeLookup:
        """One bounded GET for a runtime the cache does not have (yet)."""
        what = describe(kind, namespace, name)
        half = self.lookup_timeout / 2
        options = {"_preload_content": False, "_request_timeout": (half, half)}
        try:
            if kind == CLUSTER_KIND:
                resp = self.custom_api.get_cluster_custom_object(
                    TRAINER_GROUP, VERSION, PLURALS[kind], name, **options
                )
            else:
                resp = self.custom_api.get_namespaced_custom_object(
                    TRAINER_GROUP, VERSION, namespace or "default", PLURALS[kind], name, **options
                )
            obj = json.loads(resp.data)
        except Exception as err:
            if getattr(err, "status", None) == 404:
                return RuntimeLookup(None, f"{what} does not exist", missing=True)
            self._counters["fallback_errors"] += 1
            self._open_until = time.monotonic() + self.breaker_seconds
            return RuntimeLookup(None, f"{what} unreadable: {_short(err)}")
        return RuntimeLookup(slim({**obj, "kind": kind}))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            size = len(self._runtimes)
        return {
            "enabled": True,
            "started": self.started,
            "synced": self.synced,
            "runtimes": size,
            "watch_errors": sum(i.errors for i in self._informers if i is not self._release),
            "lastErrors": dict(self._errors),
            "trainerVersion": self.trainer,
            "trainerVersionError": self._release.last_error if self._release else "",
            **self._counters,
        }


def _dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a mapping, else an empty one (a malformed field reads as absent)."""
    return value if isinstance(value, dict) else {}


def _short(err: Exception) -> str:
    status = getattr(err, "status", None)
    return f"HTTP {status}" if status else type(err).__name__
