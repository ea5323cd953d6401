"""A small Kubernetes API server for tests: list (paginated), watch (chunked JSON lines),
GET of one Job, CronJob, JobSet, TrainJob or Kubeflow Trainer runtime, list of one
namespace's pods, Jobs, LimitRanges or Events (with their field selectors), over real
HTTP, so the real ``kubernetes`` client and our caches run their real code paths. It
reproduces the documented API behaviour we rely on: ``resourceVersion`` on lists and
events, ``continue`` tokens, and Status bodies on errors. A watch starts from the
``resourceVersion`` it asks for: the events after it are sent first, then new ones, as
the watch cache does; a version older than the oldest kept (``expire`` compacts them,
as etcd does, and ends the open watches, as an API server restart does) is answered
with a watch ``ERROR`` event, code 410 Gone, after which a client must list again
(``getAllEventsSinceLocked`` and ``newErrWatcher`` in k8s.io/apiserver
pkg/storage/cacher). Resources listed and watched: Jobs, pods, LimitRanges, Nodes and
the Kubeflow Trainer runtimes. Pods also take PATCH of ``status`` (a strategic merge patch
merges ``status.conditions`` by type: ``testkit.patches``) and DELETE as the API server makes
it: ``deletionTimestamp`` while finalizers remain (a Job's pod keeps the Job controller's
until ``remove_finalizer``), gone at once without. A PATCH of a pod or a Job (not of its
status) is validated as the API server validates those updates (``testkit.apivalidation``: a pod's
``activeDeadlineSeconds`` only set or lowered, a Job's ``backoffLimit`` the one spec field
of those that changes), then admitted by ``admit_update`` (a test's validating webhook);
``modify`` is one in-process write of a listed object (the Job controller's status, the
kubelet's). A PATCH that would leave an object's annotations over 256 KiB together is 422
Invalid (``ValidateAnnotations``), and ``write_status`` fails every write of a resource,
listed ones' PATCHes too.

``GET /version`` answers the API server's ``version.Info`` (``version_info``), settable
per test (``server_version``); ``version_status`` makes it fail: an HTTP error with a
Status body, or ``VERSION_DOWN`` for a connection closed without an answer.

It also stores Secrets and mutating/validating webhook configurations (GET, POST, PUT,
PATCH), Events, Leases, and (for GET by name) JobSets and CronJobs, with the API's write
semantics: 404 ``NotFound`` for a missing object, 409
``AlreadyExists`` on create, 409 ``Conflict`` when the ``resourceVersion`` of a PUT
body or of a patched object is not the stored one (a patch that carries
``metadata.resourceVersion`` is a precondition), JSON patch (RFC 6902) and JSON merge
patch (RFC 7386), base64 decoding of ``[]byte`` fields (Secret ``data``, ``caBundle``)
with 400 on bad input, and the validation of ``kubernetes.io/tls`` Secrets, immutable
Secrets and the immutable ``type``.

``pace`` (``testkit.pacing.Paced``), when set, is called before every request is handled
but a watch's stream: an API server that answers at a given latency and serves at most a
given rate (the scale benchmarks, docs/SCALE.md)."""

from __future__ import annotations

import copy
import itertools
import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import jsonpatch

from testkit.apivalidation import (
    annotations_too_long,
    comparable,
    invalid,
    status_body,
    update_error,
)
from testkit.patches import merge_patch, strategic_patch
from webhook.kube.wellknown import JOB_TRACKING

TRAINER = "/apis/trainer.kubeflow.org/v1alpha1"
#: Resources with list and watch (all namespaces): URL path -> resource.
LISTED = {
    "/apis/batch/v1/jobs": "jobs",
    "/api/v1/pods": "pods",
    "/apis/jobset.x-k8s.io/v1alpha2/jobsets": "jobsets",
    "/api/v1/limitranges": "limitranges",
    "/api/v1/nodes": "nodes",
    f"{TRAINER}/trainingruntimes": "trainingruntimes",
    f"{TRAINER}/clustertrainingruntimes": "clustertrainingruntimes",
}


def _runtime_target(parts: list[str]) -> tuple[str, str, str] | None:
    """(resource, namespace, name) of a GET of one Kubeflow Trainer runtime."""
    if parts[:3] != ["apis", "trainer.kubeflow.org", "v1alpha1"]:
        return None
    rest = parts[3:]
    if len(rest) == 2 and rest[0] == "clustertrainingruntimes":
        return rest[0], "", rest[1]
    if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "trainingruntimes":
        return rest[2], rest[1], rest[3]
    return None


#: Named resources with write support: URL prefix -> (resource, namespaced, kind).
NAMED = {
    "secrets": ("/api/v1", True, "Secret"),
    "configmaps": ("/api/v1", True, "ConfigMap"),
    "mutatingwebhookconfigurations": (
        "/apis/admissionregistration.k8s.io/v1",
        False,
        "MutatingWebhookConfiguration",
    ),
    "validatingwebhookconfigurations": (
        "/apis/admissionregistration.k8s.io/v1",
        False,
        "ValidatingWebhookConfiguration",
    ),
    "leases": ("/apis/coordination.k8s.io/v1", True, "Lease"),
    "events": ("/apis/events.k8s.io/v1", True, "Event"),
    # Read by name only: a Job's parents (the Event writer, the controller) and the
    # workloads ``retry-webhook status`` reads (Jobs and JobSets are listed above).
    "cronjobs": ("/apis/batch/v1", True, "CronJob"),
    "trainjobs": ("/apis/trainer.kubeflow.org/v1alpha1", True, "TrainJob"),
    "rayjobs": ("/apis/ray.io/v1", True, "RayJob"),
}

#: Field selectors an events.k8s.io/v1 list accepts, and the field each reads: the
#: API server converts them to core Event fields (``regarding.*`` to
#: ``involvedObject.*``, ``reportingController`` to ``reportingComponent``) and selects
#: on ``ToSelectableFields`` (pkg/registry/core/event/strategy.go); any other label is
#: refused with 400 "field label not supported".
EVENT_FIELDS = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "regarding.kind": ("regarding", "kind"),
    "regarding.namespace": ("regarding", "namespace"),
    "regarding.name": ("regarding", "name"),
    "regarding.uid": ("regarding", "uid"),
    "regarding.apiVersion": ("regarding", "apiVersion"),
    "regarding.resourceVersion": ("regarding", "resourceVersion"),
    "regarding.fieldPath": ("regarding", "fieldPath"),
    "reason": ("reason",),
    "type": ("type",),
    "reportingController": ("reportingController",),
}


#: ``version_status`` for a ``/version`` whose connection closes without an answer.
VERSION_DOWN = 0


def version_info(git_version: str, *, minor: str = "", emulated: str = "") -> dict[str, str]:
    """What ``GET /version`` answers for a server built as ``git_version`` (``v1.35.2``,
    ``v1.35.2-gke.1000``): ``version.Info`` of k8s.io/apimachinery/pkg/version/types.go,
    every field the kubernetes client requires, and the emulation and minimum
    compatibility versions an API server reports since 1.33 (KEP-4330: the emulated
    version is the binary's own unless it runs with ``--emulated-version``, here
    ``emulated``). ``minor`` overrides the binary's minor as providers write it (GKE and
    EKS: ``35+``)."""
    major, own_minor = git_version.removeprefix("v").split("-")[0].split(".")[:2]
    emulation_major, emulation_minor = (emulated or f"{major}.{own_minor}").split(".")
    return {
        "major": major,
        "minor": minor or own_minor,
        "emulationMajor": emulation_major,
        "emulationMinor": emulation_minor,
        "minCompatibilityMajor": emulation_major,
        "minCompatibilityMinor": str(int(emulation_minor) - 1),
        "gitVersion": git_version,
        "gitCommit": "6c1fd6e1e0e4b1b7a0a4c5f3b2d4e6f8a9b0c1d2",
        "gitTreeState": "clean",
        "buildDate": "2026-04-22T10:00:00Z",
        "goVersion": "go1.25.4",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # clients that time out on purpose (the slow-API test) are not errors


class FakeAPI:
    def __init__(self, page_size: int = 2):
        self.page_size = page_size
        self.lock = threading.Lock()
        self.version = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {r: {} for r in LISTED.values()}
        self.watchers: dict[str, list[queue.Queue]] = {r: [] for r in LISTED.values()}
        self.requests: list[tuple[str, str]] = []
        self.get_status = 200  # status for GET of one Job
        self.server_version = version_info("v1.36.0")  # what GET /version answers
        self.version_status = 200  # else that error, or VERSION_DOWN: no answer at all
        self.get_delay = 0.0
        self.fail_lists = 0  # answer this many list calls with 500 first
        self.pod_list_status = 200  # status for a list of one namespace's pods
        self.too_old_once: set[str] = set()  # resources whose next watch answers ERROR 410
        #: resource -> the events kept for watches to start from: (version, event).
        self.events: dict[str, list[tuple[int, dict[str, Any]]]] = {r: [] for r in LISTED.values()}
        #: resource -> the oldest version a watch may start from (``expire`` raises it).
        self.oldest: dict[str, int] = {r: 0 for r in LISTED.values()}
        # Secrets and webhook configurations: resource -> (namespace or "", name) -> object.
        self.named: dict[str, dict[tuple[str, str], dict[str, Any]]] = {r: {} for r in NAMED}
        self.writes: list[tuple[str, str, str]] = []  # (method, resource, name) that changed
        self.failed_writes: list[tuple[str, str, int]] = []  # (method, name, status)
        # Called with (method, resource, name) before a write is handled: tests use it to
        # make a concurrent writer change the object first (a real 409 follows).
        self.before_write = None
        #: (resource, name): RBAC says no to that object's reads and writes; (resource, ""):
        #: to listing the resource.
        self.forbidden: set[tuple[str, str]] = set()
        #: resource -> an HTTP status every write of it gets (the API failing them), and
        #: seconds each write of it waits first (a slow API).
        self.write_status: dict[str, int] = {}
        self.write_delay: dict[str, float] = {}
        self.deletions: list[tuple[str, str, int]] = []  # pods: (namespace, name, grace)
        #: Validating admission of the writes clients send to pods, Jobs and JobSets (a
        #: PATCH, as the UPDATE it is, and a pod's DELETE; not the test's own changes):
        #: called with (operation, resource, subresource, object, oldObject) before the
        #: write is stored, it returns why the write is refused (403 Forbidden, nothing
        #: changes) or None (``testkit/vap.py``).
        self.admit = None
        self.refused: list[tuple[str, str, str]] = []  # (operation, resource, why)
        #: resource -> the validating admission of a PATCH of one of its objects (not of
        #: its status): called with (stored, patched), it answers (code, message) to
        #: refuse, as a webhook's denial, or None (tests wire the webhook's engine in).
        self.admit_update: dict[str, Any] = {}
        #: Called before each request but a watch's stream is handled (``testkit.pacing``).
        self.pace: Any = None
        #: (resource, namespace, name) -> the UID of a listed object last stored or found
        #: under that name (``_listed``: checked, so objects tests store directly are found).
        self._names: dict[tuple[str, Any, Any], str] = {}
        self._uids = itertools.count(1)
        self.server = _QuietServer(("127.0.0.1", 0), self._handler())
        self.scheme = "http"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}"

    def use_tls(self, cert: Path, key: Path) -> FakeAPI:
        """Serve HTTPS with this certificate from now on (call before ``start``), as every
        API server does: a kubeconfig then trusts its CA or skips verification."""
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "https"
        return self

    def start(self) -> FakeAPI:
        self.thread.start()
        return self

    def stop(self) -> None:
        for watchers in self.watchers.values():
            for q in watchers:
                q.put(None)
        self.server.shutdown()
        self.server.server_close()

    # --- state changes, delivered to watchers like the API server does ---------
    def put(self, resource: str, obj: dict[str, Any], kind: str | None = None) -> None:
        with self.lock:
            self.version += 1
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
            uid = obj["metadata"]["uid"]
            event = kind or ("MODIFIED" if uid in self.objects[resource] else "ADDED")
            self.objects[resource][uid] = obj
            self._names[
                (resource, obj["metadata"].get("namespace"), obj["metadata"].get("name"))
            ] = uid
            self._send(resource, {"type": event, "object": copy.deepcopy(obj)})

    def modify(self, resource: str, uid: str, change: Any) -> dict[str, Any]:
        """``change`` applied to the stored object in place, under the lock, as one write
        (a controller's update of what only it writes: the Job controller's status);
        returns a copy of the object as stored."""
        with self.lock:
            obj = self.objects[resource][uid]
            change(obj)
            self.version += 1
            obj["metadata"]["resourceVersion"] = str(self.version)
            self._send(resource, {"type": "MODIFIED", "object": copy.deepcopy(obj)})
            return copy.deepcopy(obj)

    def delete(self, resource: str, uid: str) -> None:
        with self.lock:
            self.version += 1
            obj = self.objects[resource].pop(uid)
            obj["metadata"]["resourceVersion"] = str(self.version)
            self._send(resource, {"type": "DELETED", "object": copy.deepcopy(obj)})

    def _send(self, resource: str, event: dict[str, Any]) -> None:
        """Keep the event for watches to come and hand it to the open ones (lock held)."""
        self.events[resource].append((self.version, event))
        for q in self.watchers[resource]:
            q.put(event)

    def expire(self, resource: str) -> None:
        """Compact: every version up to now is too old to watch from, and the open
        watches end (as when the API server restarts), so each client watches again from
        the version it has, is answered 410 Gone, and lists again."""
        with self.lock:
            self.version += 1
            self.oldest[resource] = self.version
            self.events[resource].clear()
            for q in self.watchers[resource]:
                q.put(None)

    def store(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or overwrite a named object directly (test setup), bumping its version."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if resource in self.objects:  # a listed resource: stored as a watch would see it
            with self.lock:
                meta.setdefault("uid", f"uid-{next(self._uids)}")
            self.put(resource, obj)
            return copy.deepcopy(obj)
        with self.lock:
            self.version += 1
            meta["resourceVersion"] = str(self.version)
            meta.setdefault("uid", f"uid-{next(self._uids)}")
            self.named[resource][(meta.get("namespace", ""), meta["name"])] = obj
        return copy.deepcopy(obj)

    def touch(self, resource: str, name: str, namespace: str = "") -> None:
        """A concurrent writer: change the object's resourceVersion (and a label)."""
        with self.lock:
            obj = self.named[resource][(namespace, name)]
            self.version += 1
            obj["metadata"]["resourceVersion"] = str(self.version)
            obj["metadata"].setdefault("labels", {})["touched"] = str(self.version)

    def get(self, resource: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        with self.lock:
            obj = self.named[resource].get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def watcher_count(self, resource: str) -> int:
        with self.lock:
            return len(self.watchers[resource])

    # --- write semantics (called with the lock held) ----------------------------------
    def _create(self, resource: str, namespace: str, body: Any) -> tuple[int, dict]:
        error = invalid(resource, body, None)
        if error:
            return error
        meta = body.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            return 422, status_body(422, "Invalid", "metadata.name: Required value")
        if meta.get("namespace", namespace) != namespace:
            return 400, status_body(
                400, "BadRequest", "the namespace of the object does not match the request"
            )
        if (namespace, name) in self.named[resource]:
            kind = NAMED[resource][2]
            return 409, status_body(
                409, "AlreadyExists", f'{resource} "{name}" already exists', name, kind
            )
        self.version += 1
        meta.pop("resourceVersion", None)
        meta.update(
            {
                "resourceVersion": str(self.version),
                "uid": f"uid-{next(self._uids)}",
                "creationTimestamp": "2026-11-22T00:00:00Z",
            }
        )
        if namespace:
            meta["namespace"] = namespace
        body.setdefault(
            "apiVersion", NAMED[resource][0].removeprefix("/apis/").removeprefix("/api/")
        )
        body.setdefault("kind", NAMED[resource][2])
        self.named[resource][(namespace, name)] = body
        return 201, copy.deepcopy(body)

    def _update(self, resource: str, namespace: str, name: str, body: Any) -> tuple[int, dict]:
        current = self.named[resource].get((namespace, name))
        if current is None:
            return _not_found(resource, name)
        if not isinstance(body, dict) or (body.get("metadata") or {}).get("name") != name:
            return 400, status_body(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        return self._replace(resource, namespace, name, current, body)

    def _patch(
        self, resource: str, namespace: str, name: str, body: Any, ctype: str
    ) -> tuple[int, dict]:
        current = self.named[resource].get((namespace, name))
        if current is None:
            return _not_found(resource, name)
        if ctype == "application/json-patch+json":
            if not isinstance(body, list):
                return 400, status_body(400, "BadRequest", "a JSON patch must be a list")
            try:
                patched = jsonpatch.apply_patch(current, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
                return 422, status_body(422, "Invalid", f"the patch cannot be applied: {err}")
        elif ctype == "application/merge-patch+json":
            patched = merge_patch(copy.deepcopy(current), body)
        else:
            return 415, status_body(
                415, "UnsupportedMediaType", f"the fake API does not implement {ctype!r}"
            )
        if (patched.get("metadata") or {}).get("name") != name:
            return 400, status_body(400, "BadRequest", "a patch cannot change the name")
        return self._replace(resource, namespace, name, current, patched)

    def _replace(
        self, resource: str, namespace: str, name: str, current: dict, new: dict
    ) -> tuple[int, dict]:
        meta = new.setdefault("metadata", {})
        version = meta.get("resourceVersion")
        if version and version != current["metadata"]["resourceVersion"]:
            return 409, status_body(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name,
                NAMED[resource][2],
            )
        error = invalid(resource, new, current)
        if error:
            return error
        for key in ("uid", "creationTimestamp"):
            if key in current["metadata"]:
                meta[key] = current["metadata"][key]
        if namespace:
            meta["namespace"] = namespace
        if comparable(new) == comparable(current):
            return 200, copy.deepcopy(current)  # a no-op write keeps the resourceVersion
        self.version += 1
        meta["resourceVersion"] = str(self.version)
        self.named[resource][(namespace, name)] = new
        return 200, copy.deepcopy(new)

    def _patch_listed(
        self, resource: str, namespace: str, name: str, sub: str, body: Any, ctype: str
    ) -> tuple[int, dict]:
        """PATCH of a Job or Pod (or a pod's ``status``), delivered to watchers as
        MODIFIED. As the API server: a patch that carries ``metadata.resourceVersion`` is a
        precondition (409 when stale); a JSON patch's ``test`` op that fails is 422; a
        ``status`` patch changes only the status, any other only the rest."""
        current = self._listed(resource, namespace, name)
        if current is None:
            return 404, status_body(404, "NotFound", f'{resource} "{name}" not found', name)
        if ctype == "application/json-patch+json" and isinstance(body, list):
            try:
                patched = jsonpatch.apply_patch(current, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as err:
                return 422, status_body(422, "Invalid", f"the patch cannot be applied: {err}")
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            version = ((body or {}).get("metadata") or {}).get("resourceVersion")
            if version and version != current["metadata"]["resourceVersion"]:
                return 409, status_body(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource} "{name}": the object has '
                    "been modified; please apply your changes to the latest version and try "
                    "again",
                    name,
                )
            strategic = ctype == "application/strategic-merge-patch+json"
            patched = (strategic_patch if strategic else merge_patch)(copy.deepcopy(current), body)
        else:
            return 415, status_body(415, "UnsupportedMediaType", f"not implemented: {ctype}")
        if sub == "status":
            patched = {**copy.deepcopy(current), "status": patched.get("status")}
        else:
            patched["status"] = copy.deepcopy(current.get("status"))
        too_long = annotations_too_long(resource, name, patched)
        if too_long:
            return too_long
        for key in ("uid", "name", "namespace", "creationTimestamp"):
            patched["metadata"][key] = current["metadata"].get(key)
        if sub != "status":
            # API validation first, then the validating webhooks.
            refused = update_error(resource, patched, current)
            admit = self.admit_update.get(resource)
            refused = refused or (admit(current, patched) if admit is not None else None)
            if refused is not None:
                code, message = refused
                reason = "Invalid" if code == 422 else "Forbidden" if code == 403 else "BadRequest"
                return code, status_body(code, reason, message, name)
        why = self._admit("UPDATE", resource, sub, copy.deepcopy(patched), current)
        if why is not None:
            return 403, status_body(403, "Forbidden", why, name)
        if comparable(patched) == comparable(current):
            return 200, copy.deepcopy(current)
        self.version += 1
        patched["metadata"]["resourceVersion"] = str(self.version)
        self.objects[resource][current["metadata"]["uid"]] = patched
        self._send(resource, {"type": "MODIFIED", "object": copy.deepcopy(patched)})
        return 200, copy.deepcopy(patched)

    # --- pod deletion, as the API server and the Job controller's finalizer make it ------
    def delete_pod(self, namespace: str, name: str, grace: int | None) -> tuple[int, dict]:
        """DELETE of a pod (lock held): a pod with finalizers (a Job's has the Job
        controller's tracking finalizer) gets ``deletionTimestamp`` and
        ``deletionGracePeriodSeconds`` and stays until they are removed (``remove_finalizer``);
        one without is gone at once (``BeforeDelete`` and ``Store.Delete`` in
        k8s.io/apiserver pkg/registry). Without a grace period in the options, the pod's
        ``terminationGracePeriodSeconds`` (``CheckGracefulDelete`` of the pod strategy)."""
        current = self._named_pod(namespace, name)
        if current is None:
            return _not_found("pods", name)
        meta = current["metadata"]
        if grace is None:
            grace = (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        if not meta.get("finalizers"):
            self.objects["pods"].pop(meta["uid"])
            self.version += 1
            meta["resourceVersion"] = str(self.version)
            self._send("pods", {"type": "DELETED", "object": copy.deepcopy(current)})
            return 200, copy.deepcopy(current)
        if meta.get("deletionTimestamp") is None:
            meta["deletionTimestamp"] = "2026-11-26T10:00:30Z"
            meta["deletionGracePeriodSeconds"] = grace
            self.version += 1
            meta["resourceVersion"] = str(self.version)
            self._send("pods", {"type": "MODIFIED", "object": copy.deepcopy(current)})
        self.deletions.append((namespace, name, grace))
        return 200, copy.deepcopy(current)

    def _admit(self, operation: str, resource: str, sub: str, obj: Any, old: dict) -> str | None:
        """Validating admission of one write (lock held); why it is refused, or None."""
        if self.admit is None:
            return None
        why = self.admit(operation, resource, sub, obj, copy.deepcopy(old))
        if why is not None:
            self.refused.append((operation, f"{resource}/{sub}" if sub else resource, why))
        return why

    def remove_finalizer(self, uid: str) -> None:
        """The Job controller's removal of its tracking finalizer once it judged the pod;
        a pod being deleted then goes."""
        with self.lock:
            pod = self.objects["pods"][uid]
            pod["metadata"]["finalizers"] = [
                f for f in pod["metadata"].get("finalizers") or [] if f != JOB_TRACKING
            ]
            if pod["metadata"].get("deletionTimestamp") and not pod["metadata"]["finalizers"]:
                self.objects["pods"].pop(uid)
                kind = "DELETED"
            else:
                kind = "MODIFIED"
            self.version += 1
            pod["metadata"]["resourceVersion"] = str(self.version)
            self._send("pods", {"type": kind, "object": copy.deepcopy(pod)})

    def pod(self, uid: str) -> dict[str, Any] | None:
        with self.lock:
            found = self.objects["pods"].get(uid)
            return copy.deepcopy(found) if found is not None else None

    def _named_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._listed("pods", namespace, name)

    def _listed(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object of a listed resource by namespace and name (lock held): the
        one last stored or found under that name when it still has it, else the first
        that has (a scan: tests also store objects directly)."""
        hint = self._names.get((resource, namespace, name))
        found = self.objects[resource].get(hint) if hint is not None else None
        meta = found["metadata"] if found is not None else {}
        if found is not None and meta.get("namespace") == namespace and meta.get("name") == name:
            return found
        found = next(
            (
                o
                for o in self.objects[resource].values()
                if o["metadata"].get("namespace") == namespace and o["metadata"]["name"] == name
            ),
            None,
        )
        if found is not None:
            self._names[(resource, namespace, name)] = found["metadata"]["uid"]
        return found

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # An answer's headers and body go in two writes: with Nagle's algorithm the
            # body waits for the client's delayed ACK of the headers, 40 ms an answer.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                api.requests.append((url.path, url.query))
                if api.pace is not None and query.get("watch") not in ("true", "True", "1"):
                    api.pace()
                if url.path in ("/version", "/version/"):  # the Python client asks the latter
                    return self._version()
                if url.path in LISTED:
                    resource = LISTED[url.path]
                    if query.get("watch") in ("true", "True", "1"):
                        return self._watch(resource, query)
                    return self._list(resource, query)
                parts = url.path.strip("/").split("/")
                batch = parts[:4] == ["apis", "batch", "v1", "namespaces"]
                if batch and len(parts) == 7 and parts[5] == "jobs":
                    return self._get_job(parts[4], parts[6])
                if batch and parts[5:] == ["jobs"]:
                    return self._list_namespaced("jobs", parts[4], query)
                if parts[:3] == ["api", "v1", "namespaces"] and parts[4:] in (
                    ["pods"],
                    ["limitranges"],
                ):
                    return self._list_namespaced(parts[4], parts[3], query)
                listed = _listed_target(url.path)
                if listed is not None and listed[0] != "jobs" and not listed[3]:
                    return self._get_listed(listed[0], listed[1], listed[2])
                runtime = _runtime_target(parts)
                if runtime is not None:
                    return self._get_runtime(*runtime)
                target = _named_target(url.path)
                if target is not None and target[2]:
                    return self._named_get(*target)
                if target is not None and target[0] == "events" and target[1]:
                    return self._list_events(target[1], query)
                return self._send(404, {"kind": "Status", "code": 404, "message": "not found"})

            def do_POST(self):
                self._write("POST")

            def do_PUT(self):
                self._write("PUT")

            def do_PATCH(self):
                self._write("PATCH")

            def do_DELETE(self):
                url = urlparse(self.path)
                api.requests.append((f"DELETE {url.path}", url.query))
                if api.pace is not None:
                    api.pace()
                parts = url.path.strip("/").split("/")
                if (
                    parts[:3] != ["api", "v1", "namespaces"]
                    or len(parts) != 6
                    or parts[4] != "pods"
                ):
                    return self._status(405, "MethodNotAllowed", f"DELETE {url.path}")
                try:
                    body = self._body() or {}
                except ValueError as err:
                    return self._status(400, "BadRequest", f"invalid JSON: {err}")
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                grace = body.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
                with api.lock:
                    current = api._named_pod(parts[3], parts[5])
                    why = current and api._admit("DELETE", "pods", "", None, current)
                    if why:
                        return self._send(403, status_body(403, "Forbidden", why, parts[5]))
                    status, answer = api.delete_pod(
                        parts[3], parts[5], None if grace is None else int(grace)
                    )
                    if status < 300:
                        api.writes.append(("DELETE", "pods", parts[5]))
                self._send(status, answer)

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"null")

            def _write(self, method: str) -> None:
                url = urlparse(self.path)
                api.requests.append((f"{method} {url.path}", url.query))
                if api.pace is not None:
                    api.pace()
                target = _named_target(url.path)
                try:
                    body = self._body()
                except ValueError as err:
                    return self._status(400, "BadRequest", f"invalid JSON: {err}")
                if target is None and method == "PATCH" and _listed_target(url.path):
                    pass  # a Job's or Pod's PATCH: below
                elif target is None or (method == "POST") == bool(target[2]):
                    return self._status(405, "MethodNotAllowed", f"{method} {url.path}")
                if target is None and method == "PATCH":
                    listed = _listed_target(url.path)
                    if listed is not None:
                        ctype = (self.headers.get("Content-Type") or "").split(";")[0]
                        if api.before_write is not None:
                            api.before_write(method, listed[0], listed[2])
                        if api.write_status.get(listed[0]):
                            code = api.write_status[listed[0]]
                            message = f"{listed[0]} writes fail"
                            with api.lock:
                                api.failed_writes.append((method, listed[2], code))
                            return self._status(code, _REASONS.get(code, "InternalError"), message)
                        with api.lock:
                            status, answer = api._patch_listed(*listed, body, ctype)
                            if status < 300:
                                api.writes.append((method, listed[0], listed[2]))
                            else:
                                api.failed_writes.append((method, listed[2], status))
                        return self._send(status, answer)
                resource, namespace, name = target
                if name and (resource, name) in api.forbidden:
                    # RBAC refuses a named object's writes as its reads.
                    with api.lock:
                        api.failed_writes.append((method, name, 403))
                    return self._status(403, "Forbidden", f'cannot {method} {resource} "{name}"')
                if api.write_delay.get(resource):
                    time.sleep(api.write_delay[resource])
                if api.write_status.get(resource):
                    code = api.write_status[resource]
                    with api.lock:
                        api.failed_writes.append((method, name, code))
                    reason = _REASONS.get(code, "InternalError")
                    return self._status(code, reason, f"{resource} writes fail")
                if api.before_write is not None:
                    api.before_write(method, resource, name or (body or {}).get("metadata", {}))
                with api.lock:
                    if method == "POST":
                        status, answer = api._create(resource, namespace, body)
                        name = ((body or {}).get("metadata") or {}).get("name", "")
                    elif method == "PUT":
                        status, answer = api._update(resource, namespace, name, body)
                    else:
                        ctype = (self.headers.get("Content-Type") or "").split(";")[0]
                        status, answer = api._patch(resource, namespace, name, body, ctype)
                    if status < 300:
                        api.writes.append((method, resource, name))
                    else:
                        api.failed_writes.append((method, name, status))
                self._send(status, answer)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, status_body(code, reason, message))

            def _named_get(self, resource: str, namespace: str, name: str) -> None:
                if (resource, name) in api.forbidden:
                    return self._status(403, "Forbidden", f'cannot get {resource} "{name}"')
                obj = api.get(resource, name, namespace)
                if obj is None:
                    return self._send(*_not_found(resource, name))
                self._send(200, obj)

            def _list(self, resource: str, query: dict[str, str]) -> None:
                if (resource, "") in api.forbidden:
                    return self._status(403, "Forbidden", f"cannot list {resource}")
                if api.fail_lists > 0:
                    api.fail_lists -= 1
                    return self._send(500, {"kind": "Status", "code": 500, "message": "boom"})
                with api.lock:
                    items = sorted(
                        api.objects[resource].values(), key=lambda o: o["metadata"]["uid"]
                    )
                    items = [o for o in items if _selected(o, query)]
                    version = str(api.version)
                start = int(query.get("continue") or 0)
                limit = int(query.get("limit") or 0) or len(items)
                limit = min(limit, api.page_size)
                page = items[start : start + limit]
                meta: dict[str, Any] = {"resourceVersion": version}
                if start + limit < len(items):
                    meta["continue"] = str(start + limit)
                self._send(200, {"kind": "List", "metadata": meta, "items": page})

            def _list_namespaced(self, resource: str, namespace: str, query: dict) -> None:
                if (resource, "") in api.forbidden:
                    message = f'{resource} is forbidden: cannot list {resource} in "{namespace}"'
                    return self._status(403, "Forbidden", message)
                if resource == "pods" and api.pod_list_status != 200:
                    code = api.pod_list_status
                    return self._send(code, status_body(code, "InternalError", "boom"))
                with api.lock:
                    items = [
                        o
                        for o in api.objects[resource].values()
                        if o["metadata"].get("namespace") == namespace and _selected(o, query)
                    ]
                    version = str(api.version)
                meta = {"resourceVersion": version}
                self._send(200, {"kind": "List", "metadata": meta, "items": items})

            def _watch(self, resource: str, query: dict[str, str]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                start = int(query.get("resourceVersion") or 0)
                q: queue.Queue = queue.Queue()
                with api.lock:
                    too_old = resource in api.too_old_once or (
                        start and start < api.oldest[resource]
                    )
                    api.too_old_once.discard(resource)
                    if not too_old:
                        for version, event in api.events[resource]:
                            if version > start:
                                q.put(event)
                        api.watchers[resource].append(q)
                if too_old:
                    self._chunk(
                        {
                            "type": "ERROR",
                            "object": {
                                "kind": "Status",
                                "apiVersion": "v1",
                                "status": "Failure",
                                "reason": "Expired",
                                "code": 410,
                                "message": f"too old resource version: {start} "
                                f"({api.oldest[resource]})",
                            },
                        }
                    )
                    self._end()
                    return
                deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
                try:
                    while time.monotonic() < deadline:
                        try:
                            event = q.get(timeout=0.1)
                        except queue.Empty:
                            continue
                        if event is None:
                            break
                        if _selected(event["object"], query):
                            self._chunk(event)
                    self._end()
                except OSError:
                    pass
                finally:
                    with api.lock:
                        api.watchers[resource].remove(q)

            def _chunk(self, event: dict[str, Any]) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

            def _end(self) -> None:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _version(self) -> None:
                status = api.version_status
                if status == VERSION_DOWN:
                    self.close_connection = True  # the client sees the connection drop
                    return None
                if status != 200:
                    return self._status(status, "InternalError", "the server is unavailable")
                self._send(200, dict(api.server_version))

            def _get_runtime(self, resource: str, namespace: str, name: str) -> None:
                if api.get_status != 200:
                    return self._send(api.get_status, {"kind": "Status", "code": api.get_status})
                with api.lock:
                    for obj in api.objects[resource].values():
                        meta = obj["metadata"]
                        if meta.get("namespace", "") == namespace and meta.get("name") == name:
                            return self._send(200, obj)
                message = f'{resource} "{name}" not found'
                self._send(404, status_body(404, "NotFound", message, name))

            def _get_listed(self, resource: str, namespace: str, name: str) -> None:
                if (resource, name) in api.forbidden:
                    return self._status(403, "Forbidden", f'cannot get {resource} "{name}"')
                with api.lock:
                    found = copy.deepcopy(api._listed(resource, namespace, name))
                if found is not None:
                    return self._send(200, found)
                message = f'{resource} "{name}" not found'
                self._send(404, status_body(404, "NotFound", message, name))

            def _list_events(self, namespace: str, query: dict[str, str]) -> None:
                """A list of one namespace's Events (events.k8s.io/v1), with the field
                selectors the API server accepts for them (``EVENT_FIELDS``)."""
                if ("events", "") in api.forbidden:
                    return self._status(403, "Forbidden", "cannot list events")
                wanted = []
                for term in filter(None, (query.get("fieldSelector") or "").split(",")):
                    key, _, value = term.partition("=")
                    if key not in EVENT_FIELDS:
                        return self._status(400, "BadRequest", f"field label not supported: {key}")
                    wanted.append((EVENT_FIELDS[key], value))
                with api.lock:
                    found = [
                        copy.deepcopy(obj)
                        for (ns, _), obj in sorted(api.named["events"].items())
                        if ns == namespace
                        and all(_field(obj, path) == value for path, value in wanted)
                    ]
                    version = str(api.version)
                body = {"kind": "EventList", "apiVersion": "events.k8s.io/v1", "items": found}
                self._send(200, {**body, "metadata": {"resourceVersion": version}})

            def _get_job(self, namespace: str, name: str) -> None:
                if ("jobs", name) in api.forbidden:
                    return self._status(403, "Forbidden", f'jobs.batch "{name}" is forbidden')
                if api.get_delay:
                    time.sleep(api.get_delay)
                if api.get_status != 200:
                    return self._send(api.get_status, {"kind": "Status", "code": api.get_status})
                with api.lock:
                    found = copy.deepcopy(api._listed("jobs", namespace, name))
                if found is not None:
                    return self._send(200, found)
                self._send(404, {"kind": "Status", "code": 404, "message": "not found"})

        return Handler


def _field(obj: dict[str, Any], path: tuple[str, ...]) -> str:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def _selected(obj: dict[str, Any], query: dict[str, str]) -> bool:
    """The selectors the caches, the controller and ``status`` use: labels that exist, or
    have a value (``key=value``), comma-separated (all must hold); status.phase or
    metadata.name equals."""
    labels = obj.get("metadata", {}).get("labels") or {}
    for requirement in filter(None, (query.get("labelSelector") or "").split(",")):
        key, equals, value = requirement.partition("=")
        if key not in labels or (equals and labels[key] != value):
            return False
    field = query.get("fieldSelector")
    if field:
        key, _, value = field.partition("=")
        if key == "status.phase" and (obj.get("status") or {}).get("phase") != value:
            return False
        if key == "metadata.name" and obj.get("metadata", {}).get("name") != value:
            return False
    return True


def write_kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig that points the real client (or a server subprocess) at ``url``."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: fake, user: {token: test}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
    )
    return path


def _named_target(path: str) -> tuple[str, str, str] | None:
    """(resource, namespace or "", name or "") for a URL of a ``NAMED`` resource."""
    parts = path.strip("/").split("/")
    for resource, (prefix, namespaced, _kind) in NAMED.items():
        base = prefix.strip("/").split("/")
        if parts[: len(base)] != base:
            continue
        rest = parts[len(base) :]
        if namespaced and len(rest) in (3, 4) and rest[0] == "namespaces" and rest[2] == resource:
            return resource, rest[1], rest[3] if len(rest) == 4 else ""
        if not namespaced and len(rest) in (1, 2) and rest[0] == resource:
            return resource, "", rest[1] if len(rest) == 2 else ""
    return None


#: Listed resources that also take PATCH of one object (``/<prefix>/namespaces/NS/<r>/NAME``,
#: ``.../pods/NAME/status``): resource -> URL prefix.
PATCHED = {"jobs": "/apis/batch/v1", "pods": "/api/v1", "jobsets": "/apis/jobset.x-k8s.io/v1alpha2"}


def _listed_target(path: str) -> tuple[str, str, str, str] | None:
    """(resource, namespace, name, subresource or "") for a PATCH of a listed object."""
    parts = path.strip("/").split("/")
    for resource, prefix in PATCHED.items():
        base = prefix.strip("/").split("/")
        rest = parts[len(base) :]
        if parts[: len(base)] == base and len(rest) in (4, 5) and rest[0] == "namespaces":
            if rest[2] == resource:
                return resource, rest[1], rest[3], rest[4] if len(rest) == 5 else ""
    return None


#: A Status's reason for the codes ``write_status`` answers with (metav1.StatusReason).
_REASONS = {403: "Forbidden", 422: "Invalid", 429: "TooManyRequests", 503: "ServiceUnavailable"}


def _not_found(resource: str, name: str) -> tuple[int, dict]:
    return 404, status_body(
        404, "NotFound", f'{resource} "{name}" not found', name, NAMED[resource][2]
    )


def applied(cache: Any) -> list[str]:
    """The ``resourceVersion`` of each watch event the cache's informers apply from now on:
    a sync point for a test that asserts a change made no difference (waiting for the
    change to be applied, not for a time it might take)."""
    seen: list[str] = []
    for informer in cache._informers:
        apply = informer.apply

        def recording(kind: str, obj: dict[str, Any], apply: Any = apply) -> None:
            apply(kind, obj)
            seen.append((obj.get("metadata") or {}).get("resourceVersion"))

        informer.apply = recording
    return seen
