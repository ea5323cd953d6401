"""A small Kubernetes API server for tests: list (paginated), watch (chunked JSON lines),
and GET of one Job, over real HTTP, so the real ``kubernetes`` client and our attempt
cache run their real code paths. It reproduces the documented API behaviour we rely
on: ``resourceVersion`` on lists and events, ``continue`` tokens, watch ``ERROR``
events with code 410 when a version is too old, and Status bodies on errors."""

from __future__ import annotations

import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # clients that time out on purpose (the slow-API test) are not errors


class FakeAPI:
    def __init__(self, page_size: int = 2):
        self.page_size = page_size
        self.lock = threading.Lock()
        self.version = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"jobs": {}, "pods": {}}
        self.watchers: dict[str, list[queue.Queue]] = {"jobs": [], "pods": []}
        self.requests: list[tuple[str, str]] = []
        self.get_status = 200  # status for GET of one Job
        self.get_delay = 0.0
        self.fail_lists = 0  # answer this many list calls with 500 first
        self.too_old_once: set[str] = set()  # resources whose next watch answers ERROR 410
        self.server = _QuietServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

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
            for q in self.watchers[resource]:
                q.put({"type": event, "object": obj})

    def delete(self, resource: str, uid: str) -> None:
        with self.lock:
            self.version += 1
            obj = self.objects[resource].pop(uid)
            obj["metadata"]["resourceVersion"] = str(self.version)
            for q in self.watchers[resource]:
                q.put({"type": "DELETED", "object": obj})

    def watcher_count(self, resource: str) -> int:
        with self.lock:
            return len(self.watchers[resource])

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

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
                if url.path in ("/apis/batch/v1/jobs", "/api/v1/pods"):
                    resource = "jobs" if "jobs" in url.path else "pods"
                    if query.get("watch") in ("true", "True", "1"):
                        return self._watch(resource, query)
                    return self._list(resource, query)
                parts = url.path.strip("/").split("/")
                if parts[:4] == ["apis", "batch", "v1", "namespaces"] and len(parts) == 7:
                    return self._get_job(parts[4], parts[6])
                return self._send(404, {"kind": "Status", "code": 404, "message": "not found"})

            def _list(self, resource: str, query: dict[str, str]) -> None:
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

            def _watch(self, resource: str, query: dict[str, str]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if resource in api.too_old_once:
                    api.too_old_once.discard(resource)
                    self._chunk(
                        {
                            "type": "ERROR",
                            "object": {
                                "kind": "Status",
                                "code": 410,
                                "message": "too old resource version",
                            },
                        }
                    )
                    self._end()
                    return
                q: queue.Queue = queue.Queue()
                with api.lock:
                    api.watchers[resource].append(q)
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

            def _get_job(self, namespace: str, name: str) -> None:
                if api.get_delay:
                    time.sleep(api.get_delay)
                if api.get_status != 200:
                    return self._send(api.get_status, {"kind": "Status", "code": api.get_status})
                with api.lock:
                    for obj in api.objects["jobs"].values():
                        meta = obj["metadata"]
                        if meta.get("namespace") == namespace and meta.get("name") == name:
                            return self._send(200, obj)
                self._send(404, {"kind": "Status", "code": 404, "message": "not found"})

        return Handler


def _selected(obj: dict[str, Any], query: dict[str, str]) -> bool:
    """The two selectors the cache uses: a label exists, and status.phase equals."""
    labels = obj.get("metadata", {}).get("labels") or {}
    selector = query.get("labelSelector")
    if selector and selector not in labels:
        return False
    field = query.get("fieldSelector")
    if field:
        key, _, value = field.partition("=")
        if key == "status.phase" and (obj.get("status") or {}).get("phase") != value:
            return False
    return True
