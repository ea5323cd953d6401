"""The test API's HTTP side (``testkit.fakeapi``): one request handler whose GETs go by
a route table (``GET``: each route matches a path and query and names the method that
answers it) and whose writes go to the store (``testkit.fakeapi.server.FakeAPI``)."""

from __future__ import annotations

import copy
import json
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from testkit.apivalidation import namespace_terminating, status_body
from testkit.fakeapi.paths import (
    EVENT_FIELDS,
    LISTED,
    REASONS,
    field_of,
    listed_target,
    named_target,
    not_found,
    runtime_target,
    selected,
)

#: ``version_status`` for a ``/version`` whose connection closes without an answer.
VERSION_DOWN = 0

Query = dict[str, str]
BATCH = ["apis", "batch", "v1", "namespaces"]


def _watching(query: Query) -> bool:
    return query.get("watch") in ("true", "True", "1")


@dataclass(frozen=True)
class Route:
    """One kind of GET: ``match`` reads the path (whole, and split at "/") and the query,
    and gives the arguments of the ``Handler`` method named ``answer``, or ``None``."""

    match: Callable[[str, list[str], Query], tuple | None]
    answer: str


def _named(path: str, parts: list[str], query: Query) -> tuple | None:
    target = named_target(path)
    return target if target is not None and target[2] else None


def _events(path: str, parts: list[str], query: Query) -> tuple | None:
    target = named_target(path)
    if target is not None and target[0] == "events" and target[1]:
        return target[1], query
    return None


def _listed_get(path: str, parts: list[str], query: Query) -> tuple | None:
    listed = listed_target(path)
    if listed is not None and listed[0] != "jobs" and not listed[3]:
        return listed[:3]
    return None


#: The GETs the test API answers, tried in order; the first that matches answers.
GET: tuple[Route, ...] = (
    # (The Python client asks for "/version/".)
    Route(lambda path, _, q: () if path in ("/version", "/version/") else None, "_version"),
    Route(
        lambda path, _, q: (LISTED[path], q) if path in LISTED and _watching(q) else None, "_watch"
    ),
    Route(lambda path, _, q: (LISTED[path], q) if path in LISTED else None, "_list"),
    Route(
        lambda _, p, q: (p[4], p[6]) if p[:4] == BATCH and len(p) == 7 and p[5] == "jobs" else None,
        "_get_job",
    ),
    Route(
        lambda _, p, q: ("jobs", p[4], q) if p[:4] == BATCH and p[5:] == ["jobs"] else None,
        "_list_namespaced",
    ),
    Route(
        lambda _, p, q: (
            (p[4], p[3], q)
            if p[:3] == ["api", "v1", "namespaces"] and p[4:] in (["pods"], ["limitranges"])
            else None
        ),
        "_list_namespaced",
    ),
    Route(_listed_get, "_get_listed"),
    Route(lambda _, p, q: runtime_target(p), "_get_runtime"),
    Route(_named, "_named_get"),
    Route(_events, "_list_events"),
)


class Handler(BaseHTTPRequestHandler):
    """One request to the test API (its store: ``api``, set by ``handler_for``)."""

    api: Any
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
        self.api.requests.append((url.path, url.query))
        if self.api.pace is not None and not _watching(query):
            self.api.pace()
        parts = url.path.strip("/").split("/")
        for route in GET:
            args = route.match(url.path, parts, query)
            if args is not None:
                return getattr(self, route.answer)(*args)
        return self._send(404, {"kind": "Status", "code": 404, "message": "not found"})

    def do_POST(self):
        self._write("POST")

    def do_PUT(self):
        self._write("PUT")

    def do_PATCH(self):
        self._write("PATCH")

    def do_DELETE(self):
        url = urlparse(self.path)
        self.api.requests.append((f"DELETE {url.path}", url.query))
        if self.api.pace is not None:
            self.api.pace()
        parts = url.path.strip("/").split("/")
        if parts[:3] != ["api", "v1", "namespaces"] or len(parts) != 6 or parts[4] != "pods":
            return self._status(405, "MethodNotAllowed", f"DELETE {url.path}")
        try:
            body = self._body() or {}
        except ValueError as err:
            return self._status(400, "BadRequest", f"invalid JSON: {err}")
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        grace = body.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        with self.api.lock:
            current = self.api._named_pod(parts[3], parts[5])
            why = current and self.api._admit("DELETE", "pods", "", None, current)
            if why:
                return self._send(403, status_body(403, "Forbidden", why, parts[5]))
            status, answer = self.api.delete_pod(
                parts[3], parts[5], None if grace is None else int(grace)
            )
            if status < 300:
                self.api.writes.append(("DELETE", "pods", parts[5]))
        self._send(status, answer)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def _write(self, method: str) -> None:
        url = urlparse(self.path)
        self.api.requests.append((f"{method} {url.path}", url.query))
        if self.api.pace is not None:
            self.api.pace()
        target = named_target(url.path)
        try:
            body = self._body()
        except ValueError as err:
            return self._status(400, "BadRequest", f"invalid JSON: {err}")
        if target is None and method == "PATCH" and listed_target(url.path):
            pass  # a Job's or Pod's PATCH: below
        elif target is None or (method == "POST") == bool(target[2]):
            return self._status(405, "MethodNotAllowed", f"{method} {url.path}")
        if target is None and method == "PATCH":
            listed = listed_target(url.path)
            if listed is not None:
                ctype = (self.headers.get("Content-Type") or "").split(";")[0]
                if self.api.before_write is not None:
                    self.api.before_write(method, listed[0], listed[2])
                if self.api.write_status.get(listed[0]):
                    code = self.api.write_status[listed[0]]
                    message = f"{listed[0]} writes fail"
                    with self.api.lock:
                        self.api.failed_writes.append((method, listed[2], code))
                    return self._status(code, REASONS.get(code, "InternalError"), message)
                with self.api.lock:
                    status, answer = self.api._patch_listed(*listed, body, ctype)
                    if status < 300:
                        self.api.writes.append((method, listed[0], listed[2]))
                    else:
                        self.api.failed_writes.append((method, listed[2], status))
                return self._send(status, answer)
        resource, namespace, name = target
        if name and (resource, name) in self.api.forbidden:
            # RBAC refuses a named object's writes as its reads.
            with self.api.lock:
                self.api.failed_writes.append((method, name, 403))
            return self._status(403, "Forbidden", f'cannot {method} {resource} "{name}"')
        if self.api.write_delay.get(resource):
            time.sleep(self.api.write_delay[resource])
        if self.api.write_status.get(resource):
            code = self.api.write_status[resource]
            with self.api.lock:
                self.api.failed_writes.append((method, name, code))
            reason = REASONS.get(code, "InternalError")
            return self._status(code, reason, f"{resource} writes fail")
        if self.api.before_write is not None:
            self.api.before_write(method, resource, name or (body or {}).get("metadata", {}))
        if method == "POST" and namespace in self.api.gone_namespaces:
            # NamespaceLifecycle's lookup of a namespace that is not there (``Admit``:
            # the namespaces Get's NotFound, returned as it is).
            created = ((body or {}).get("metadata") or {}).get("name", "")
            with self.api.lock:
                self.api.failed_writes.append((method, created, 404))
            message = f'namespaces "{namespace}" not found'
            return self._send(404, status_body(404, "NotFound", message, namespace, "namespaces"))
        if method == "POST" and namespace in self.api.terminating:
            created = ((body or {}).get("metadata") or {}).get("name", "")
            with self.api.lock:
                self.api.failed_writes.append((method, created, 403))
            group = self.path.split("/")[2] if self.path.startswith("/apis/") else ""
            return self._send(403, namespace_terminating(resource, group, namespace, created))
        with self.api.lock:
            if method == "POST":
                status, answer = self.api._create(resource, namespace, body)
                name = ((body or {}).get("metadata") or {}).get("name", "")
            elif method == "PUT":
                status, answer = self.api._update(resource, namespace, name, body)
            else:
                ctype = (self.headers.get("Content-Type") or "").split(";")[0]
                status, answer = self.api._patch(resource, namespace, name, body, ctype)
            if status < 300:
                self.api.writes.append((method, resource, name))
            else:
                self.api.failed_writes.append((method, name, status))
        self._send(status, answer)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(code, status_body(code, reason, message))

    def _named_get(self, resource: str, namespace: str, name: str) -> None:
        if (resource, name) in self.api.forbidden:
            return self._status(403, "Forbidden", f'cannot get {resource} "{name}"')
        obj = self.api.get(resource, name, namespace)
        if obj is None:
            return self._send(*not_found(resource, name))
        self._send(200, obj)

    def _list(self, resource: str, query: dict[str, str]) -> None:
        if (resource, "") in self.api.forbidden:
            return self._status(403, "Forbidden", f"cannot list {resource}")
        if self.api.fail_lists > 0:
            self.api.fail_lists -= 1
            return self._send(500, {"kind": "Status", "code": 500, "message": "boom"})
        # Every page of a list is read at its first page's resourceVersion, which is the
        # list's (a continue token carries it: ``GetList`` in k8s.io/apiserver
        # pkg/storage/etcd3/store.go), so a watch from it misses no change made while
        # the pages came.
        token = query.get("continue") or ""
        key, _, offset = token.partition(":")
        with self.api.lock:
            if token:
                snapshot = self.api.snapshots.get(key)
                if snapshot is None:
                    return self._status(410, "Expired", "the continue token has expired")
                version, items = snapshot
            else:
                items = sorted(
                    self.api.objects[resource].values(), key=lambda o: o["metadata"]["uid"]
                )
                items = [o for o in items if selected(o, query)]
                version = str(self.api.version)
            limit = min(int(query.get("limit") or 0) or len(items), self.api.page_size)
            if not token and limit < len(items):  # pages to come: as they are at `version`
                # Kept encoded, each page decoded as it is served: a deepcopy of 100,000
                # Jobs held the lock (and one decode of them all the GIL) for seconds,
                # long enough for the controller's Lease renewals to miss their deadline.
                items = [json.dumps(o) for o in items]
        start = int(offset or 0)
        page = [json.loads(o) if isinstance(o, str) else o for o in items[start : start + limit]]
        meta: dict[str, Any] = {"resourceVersion": version}
        if start + limit < len(items):
            with self.api.lock:
                key = key or f"{resource}-{next(self.api._uids)}"
                self.api.snapshots[key] = (version, items)
                self.api.snapshots.move_to_end(key)
                while len(self.api.snapshots) > 16:
                    self.api.snapshots.popitem(last=False)
            meta["continue"] = f"{key}:{start + limit}"
        elif token:
            with self.api.lock:
                self.api.snapshots.pop(key, None)
        self._send(200, {"kind": "List", "metadata": meta, "items": page})

    def _list_namespaced(self, resource: str, namespace: str, query: dict) -> None:
        if (resource, "") in self.api.forbidden:
            message = f'{resource} is forbidden: cannot list {resource} in "{namespace}"'
            return self._status(403, "Forbidden", message)
        if resource == "pods" and self.api.pod_list_status != 200:
            code = self.api.pod_list_status
            return self._send(code, status_body(code, "InternalError", "boom"))
        with self.api.lock:
            items = [
                o
                for o in self.api.objects[resource].values()
                if o["metadata"].get("namespace") == namespace and selected(o, query)
            ]
            version = str(self.api.version)
        meta = {"resourceVersion": version}
        self._send(200, {"kind": "List", "metadata": meta, "items": items})

    def _watch(self, resource: str, query: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        start = int(query.get("resourceVersion") or 0)
        q: queue.Queue = queue.Queue()
        with self.api.lock:
            too_old = resource in self.api.too_old_once or (
                start and start < self.api.oldest[resource]
            )
            self.api.too_old_once.discard(resource)
            if not too_old:
                for version, event in self.api.events[resource]:
                    if version > start:
                        q.put(event)
                self.api.watchers[resource].append(q)
                self.api.opened[resource] += 1
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
                        f"({self.api.oldest[resource]})",
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
                if selected(event["object"], query):
                    self._chunk(event)
            self._end()
        except OSError:
            pass
        finally:
            with self.api.lock:
                self.api.watchers[resource].remove(q)

    def _chunk(self, event: dict[str, Any]) -> None:
        line = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _version(self) -> None:
        status = self.api.version_status
        if status == VERSION_DOWN:
            self.close_connection = True  # the client sees the connection drop
            return None
        if status != 200:
            return self._status(status, "InternalError", "the server is unavailable")
        self._send(200, dict(self.api.server_version))

    def _get_runtime(self, resource: str, namespace: str, name: str) -> None:
        if self.api.get_status != 200:
            return self._send(self.api.get_status, {"kind": "Status", "code": self.api.get_status})
        with self.api.lock:
            for obj in self.api.objects[resource].values():
                meta = obj["metadata"]
                if meta.get("namespace", "") == namespace and meta.get("name") == name:
                    return self._send(200, obj)
        message = f'{resource} "{name}" not found'
        self._send(404, status_body(404, "NotFound", message, name))

    def _get_listed(self, resource: str, namespace: str, name: str) -> None:
        if (resource, name) in self.api.forbidden:
            return self._status(403, "Forbidden", f'cannot get {resource} "{name}"')
        with self.api.lock:
            found = copy.deepcopy(self.api._listed(resource, namespace, name))
        if found is not None:
            return self._send(200, found)
        message = f'{resource} "{name}" not found'
        self._send(404, status_body(404, "NotFound", message, name))

    def _list_events(self, namespace: str, query: dict[str, str]) -> None:
        """A list of one namespace's Events (events.k8s.io/v1), with the field
        selectors the API server accepts for them (``EVENT_FIELDS``)."""
        if ("events", "") in self.api.forbidden:
            return self._status(403, "Forbidden", "cannot list events")
        wanted = []
        for term in filter(None, (query.get("fieldSelector") or "").split(",")):
            key, _, value = term.partition("=")
            if key not in EVENT_FIELDS:
                return self._status(400, "BadRequest", f"field label not supported: {key}")
            wanted.append((EVENT_FIELDS[key], value))
        with self.api.lock:
            found = [
                copy.deepcopy(obj)
                for (ns, _), obj in sorted(self.api.named["events"].items())
                if ns == namespace and all(field_of(obj, path) == value for path, value in wanted)
            ]
            version = str(self.api.version)
        body = {"kind": "EventList", "apiVersion": "events.k8s.io/v1", "items": found}
        self._send(200, {**body, "metadata": {"resourceVersion": version}})

    def _get_job(self, namespace: str, name: str) -> None:
        if ("jobs", name) in self.api.forbidden:
            return self._status(403, "Forbidden", f'jobs.batch "{name}" is forbidden')
        if self.api.get_delay:
            time.sleep(self.api.get_delay)
        if self.api.get_status != 200:
            return self._send(self.api.get_status, {"kind": "Status", "code": self.api.get_status})
        with self.api.lock:
            found = copy.deepcopy(self.api._listed("jobs", namespace, name))
        if found is not None:
            return self._send(200, found)
        self._send(404, {"kind": "Status", "code": 404, "message": "not found"})


def handler_for(api: Any) -> type[Handler]:
    """The handler class of one test API (its store as ``api``)."""
    return type("Handler", (Handler,), {"api": api})
