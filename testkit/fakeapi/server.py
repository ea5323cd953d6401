"""The test API's store and server (``testkit.fakeapi``): the objects, their versions and
watchers, and the API's write semantics, served over HTTP by ``testkit.fakeapi.handler``."""

from __future__ import annotations

import copy
import itertools
import queue
import threading
from collections import OrderedDict
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonpatch

from testkit.apivalidation import (
    annotations_too_long,
    comparable,
    invalid,
    status_body,
    update_error,
)
from testkit.fakeapi.handler import handler_for
from testkit.fakeapi.paths import LISTED, NAMED, not_found
from testkit.patches import merge_patch, strategic_patch
from webhook.kube.wellknown import JOB_TRACKING


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
        #: A paged list's pages come from the objects as they were at its first page
        #: (continue token -> (resourceVersion, the objects then)), the last few lists'.
        self.snapshots: OrderedDict[str, tuple[str, list[dict[str, Any]]]] = OrderedDict()
        self.lock = threading.Lock()
        self.version = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {r: {} for r in LISTED.values()}
        self.watchers: dict[str, list[queue.Queue]] = {r: [] for r in LISTED.values()}
        #: Watches opened (not answered 410), per resource: after ``expire`` each one is a
        #: client that listed again, until a watch it opened since times out.
        self.opened: dict[str, int] = {r: 0 for r in LISTED.values()}
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
        #: Namespaces being deleted: a create in one is refused (NamespaceLifecycle); and
        #: namespaces gone, where a create is answered 404 for the namespace.
        self.terminating: set[str] = set()
        self.gone_namespaces: set[str] = set()
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
        self.server = _QuietServer(("127.0.0.1", 0), handler_for(self))
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
            return not_found(resource, name)
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
            return not_found(resource, name)
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
            return not_found("pods", name)
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


def write_kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig that points the real client (or a server subprocess) at ``url``."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: fake, user: {token: test}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
    )
    return path


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
