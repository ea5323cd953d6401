"""List-then-watch informers: the base of every cache that keeps part of the cluster in
memory (Jobs and failed pods, LimitRanges, Nodes, Trainer runtimes, workload records),
and of the controller's watches. Objects are plain JSON, and a relist (after a 410, an
API server restart, a dropped connection) delivers every object again: each cache must
take an object it has seen as the same object (``ListedWhole`` swaps in a whole new
store)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Self

log = logging.getLogger(__name__)


def strip(obj: Any) -> Any:
    """``obj`` without ``metadata.managedFields``: no cache reads them, and they are often
    the larger part of an object as the API server sends it, held while a list's pages come
    (as controller-runtime's ``TransformStripManagedFields`` and client-go's
    ``SetTransform`` drop them). Its namespace is interned: the caches key and keep
    objects by it, and a cluster's Jobs share a few namespaces, each decoded anew for
    every object (at 100,000 Jobs about 5 MB of copies)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        namespace = meta.get("namespace")
        if type(namespace) is str:
            meta["namespace"] = sys.intern(namespace)
    return obj


def _pack(items: list[Any]) -> bytes:
    """A list page's objects, without their managed fields, as compressed JSON: about
    40 KB a page of 500 Jobs, where decoded they take megabytes."""
    text = json.dumps([strip(item) for item in items], separators=(",", ":"))
    return zlib.compress(text.encode(), 1)


def _unpack(packed: bytes) -> list[Any]:
    items: list[Any] = json.loads(zlib.decompress(packed))
    return items


class Informer:
    """List-then-watch one resource, calling ``apply(type, object)`` for each event.

    Objects are decoded as plain JSON (not into the client's model classes, which is
    an order of magnitude slower and larger): only a few fields are kept.
    """

    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        reset: Callable[[], None],
        apply: Callable[[str, Mapping[str, Any]], None],
        kwargs: Mapping[str, Any],
        stop: threading.Event,
        label: str = "attempt cache",
        relisted: Callable[[], None] | None = None,
        staged: bool = False,
    ):
        self.label = label
        #: Called when a list's objects have all been applied (after ``reset``): a cache
        #: that must never answer from half a list swaps in the new one then.
        self.relisted = relisted
        #: Whether ``reset`` starts a new store that lookups read only from ``relisted``
        #: (``ListedWhole``): then every list's pages are applied as they come. Any other
        #: cache gets a relist's objects only once all its pages are in, so that it is
        #: never read half-filled for longer than the applying takes.
        self.staged = staged
        self._listed = False
        self.name = name
        self.list_fn = list_fn
        self.reset = reset
        self.apply = apply
        self.kwargs = dict(kwargs)
        self.stop = stop
        self.synced = threading.Event()
        self.errors = 0
        #: Why the last list or watch failed ("" once a list succeeds): what a lookup that
        #: cannot be answered says.
        self.last_error = ""

    def run(self) -> None:
        backoff = 0.5
        while not self.stop.is_set():
            try:
                version = self._list()
                self.last_error = ""
                self.synced.set()
                backoff = 0.5
                self._watch(version)
            except Exception as err:  # the loop must survive anything the API does
                self.errors += 1
                self.last_error = short_error(err)
                log.warning("%s %s: %s; relisting in %.1fs", self.label, self.name, err, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _list(self) -> str:
        """One full list, in pages of 500. It sets no ``resourceVersion`` nor
        ``resourceVersionMatch``: a consistent read (the latest state), which the API server
        serves from etcd on 1.30 (``shouldDelegateList`` in
        staging/src/k8s.io/apiserver/pkg/storage/cacher) and from its watch cache from 1.31,
        where ``ConsistentListFromCache`` is on by default and etcd answers progress
        requests; later pages (``continue``) still go to etcd unless the server serves
        pagination from its cache (KEP-4988). The watch that follows, from the list's
        ``resourceVersion``, is always served from the watch cache. (``resourceVersion=0``
        would be served from the cache on 1.30 too, but may be stale and ignores ``limit``.)"""
        # A first list (nothing is answered from the store before it is synced) or a
        # staged one is applied page by page: the decoded list is never held whole, which
        # at 100,000 Jobs is most of the process's memory. Any other relist holds its
        # pages packed (``_pack``) until the last has come, and decodes them one by one
        # as it applies them: decoded, the pages of 100,000 Jobs took as much again as
        # the caches themselves, held beside them.
        stream = self.staged or not self._listed
        token = None
        held: list[bytes] = []
        if stream:
            self.reset()
        while True:
            resp = self.list_fn(
                limit=500,
                _continue=token,
                _preload_content=False,
                _request_timeout=60,
                **self.kwargs,
            )
            page = json.loads(resp.data)
            items = page.pop("items", None) or []
            if stream:
                items.reverse()
                while items:  # each object freed once its cache took what it keeps
                    self.apply("ADDED", strip(items.pop()))
            else:
                held.append(_pack(items))
                del items
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                version = (page.get("metadata") or {}).get("resourceVersion") or ""
                break
        if not stream:
            self.reset()
            while held:
                for item in _unpack(held.pop(0)):
                    self.apply("ADDED", item)
        if self.relisted is not None:
            self.relisted()
        self._listed = True
        return version

    def _watch(self, version: str) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        while not self.stop.is_set():
            resp = self.list_fn(
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=240,
                _preload_content=False,
                _request_timeout=(10, 300),
                **self.kwargs,
            )
            try:
                for line in iter_resp_lines(resp):
                    event = json.loads(line)
                    kind = event.get("type")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.apply(kind, strip(obj))
                    if self.stop.is_set():
                        return
            finally:
                resp.release_conn()


class Informers:
    """The threads of a cache's informers (``_informers``, set by the subclass): started
    once, stopped together; synced when every informer has listed once."""

    _informers: list[Informer]

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._started_at = 0.0

    @property
    def started(self) -> bool:
        return bool(self._threads)

    def start(self) -> Self:
        with self._start_lock:
            if self._threads:
                return self
            self._started_at = time.monotonic()
            for informer in self._informers:
                thread = threading.Thread(
                    target=informer.run, name=f"cache-{informer.name}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(i.synced.wait(max(0.0, deadline - time.monotonic())) for i in self._informers)

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self._informers)


class ListedWhole(Informers):
    """A cache of one resource that a relist replaces whole: a list's objects go to a new
    store, which lookups read only once all of them are in (no lookup sees half a list);
    watch events go to the store lookups read. A subclass stores an object (``_store``:
    ``store`` updated for one event; the key it changed, ``None`` when nothing changed)
    and refreshes what it derives from the store (``_refresh``: the keys that changed,
    ``None`` for all), both called with ``_lock`` held."""

    def __init__(self, name: str, list_fn: Callable[..., Any], label: str):
        super().__init__()
        self._lock = threading.Lock()
        self._objects: dict[Any, Any] = {}
        self._staging: dict[Any, Any] | None = None
        self._informers = [
            Informer(
                name,
                list_fn,
                self._reset,
                self._apply,
                {},
                self._stop,
                label=label,
                relisted=self._relisted,
                staged=True,
            )
        ]

    def _store(self, store: dict[Any, Any], kind: str, obj: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def _refresh(self, keys: set[Any] | None) -> None:
        raise NotImplementedError

    def _reset(self) -> None:
        with self._lock:
            self._staging = {}

    def _relisted(self) -> None:
        with self._lock:
            if self._staging is not None:
                changed = self._staging != self._objects
                self._objects, self._staging = self._staging, None
                if changed:
                    self._refresh(None)

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            live = self._staging is None
            key = self._store(self._objects if live else self._staging, kind, obj)
            if live and key is not None:
                self._refresh({key})


def short_error(err: Exception) -> str:
    """An API error in a few words: its HTTP status, else its type."""
    status = getattr(err, "status", None)
    if status:
        return f"HTTP {status}"
    return type(err).__name__
