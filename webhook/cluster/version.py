"""The cluster's Kubernetes version, learned from the API server's ``/version``.

Asked once when a worker starts and again every ``REFRESH_SECONDS`` (a control plane is
upgraded under a running webhook), from the maintenance thread: an admission only reads
the last answer, never waits on the API. When ``/version`` cannot be read the last known
version is kept; before any answer the version is unknown, and a policy that depends on
it is not applied (``plan.inplace``) rather than guessed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from webhook.kube.objects import mapping
from webhook.kube.versions import KubeVersion
from webhook.policy.config import Config
from webhook.policy.model import KEYS

log = logging.getLogger(__name__)

REFRESH_SECONDS = 600.0
#: After a failure, ask again sooner than a full refresh.
RETRY_SECONDS = 30.0
#: What the offline commands assume without ``--kubernetes-version`` or a config pin: the
#: newest release whose gated fields the policy knows.
ASSUMED_VERSION = KubeVersion(1, 36)
IN_PLACE_KEY = KEYS["in-place-exit-codes"].annotation


class VersionSource(Protocol):
    def kubernetes_version(self) -> KubeVersion | None: ...

    def stats(self) -> dict[str, Any]: ...


class UnknownVersion:
    """No cluster to ask (the dry run without ``--kubernetes-version``, tests)."""

    def kubernetes_version(self) -> KubeVersion | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"source": "none"}


class GivenVersion:
    """A version given by hand: ``--kubernetes-version`` on the command line."""

    def __init__(self, version: KubeVersion):
        self.version = version

    def kubernetes_version(self) -> KubeVersion | None:
        return self.version

    def stats(self) -> dict[str, Any]:
        return {"source": "given", "version": str(self.version)}


class ServerVersion:
    """The API server's answer, refreshed by ``poll`` (called by the maintenance loop)."""

    def __init__(self, api_client: Any, timeout: float = 5.0):
        import copy

        from kubernetes import client

        # A client of its own, retrying once: urllib3's default three retries made an API
        # that accepts connections but never answers hold a worker's start for 4 timeouts.
        configuration = copy.copy(api_client.configuration)
        configuration.retries = 1
        self._api = client.VersionApi(client.ApiClient(configuration))
        self._timeout = timeout
        self._lock = threading.Lock()
        self._version: KubeVersion | None = None
        self._next = 0.0
        self.last_error: str | None = None
        self.checked_at: float | None = None

    def kubernetes_version(self) -> KubeVersion | None:
        return self._version

    def poll(self, now: float | None = None) -> None:
        """Ask ``/version`` when it is due; keep the last answer when the API fails."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if now < self._next:
                return
            self._next = now + RETRY_SECONDS
        try:
            info = self._api.get_code(_request_timeout=self._timeout)
            version = KubeVersion.of_server(*_gates_version(info))
        except Exception as err:  # any failure: keep what we knew
            self.last_error = f"{type(err).__name__}: {err}"[:300]
            log.warning("cannot read the Kubernetes version: %s", self.last_error)
            return
        if version != self._version:
            log.info("Kubernetes version %s (was %s)", version, self._version)
        self._version = version
        self.last_error = None
        self.checked_at = now
        with self._lock:
            self._next = now + REFRESH_SECONDS

    def stats(self) -> dict[str, Any]:
        return {
            "source": "apiserver",
            "version": str(self._version) if self._version else None,
            "error": self.last_error,
        }


def _gates_version(info: Any) -> tuple[str, str, str]:
    """The version whose feature gates are on: an API server run with
    ``--emulated-version`` (KEP-4330) reports its binary as ``major``/``minor`` and the
    emulated release, whose gate defaults it follows, as ``emulationMajor``/
    ``emulationMinor`` (since 1.33; absent from older servers and clients)."""
    major = getattr(info, "emulation_major", None)
    minor = getattr(info, "emulation_minor", None)
    if major and minor:
        return major, minor, ""
    return info.major, info.minor, info.git_version or ""


def version_for(
    given: KubeVersion | None, config: Config, objects: Iterable[Mapping[str, Any]]
) -> tuple[GivenVersion, bool]:
    """The version the offline commands judge against: ``given`` (``--kubernetes-version``),
    else the config's pin, else ``ASSUMED_VERSION``; and whether it was assumed for a
    policy that depends on it (in-place restarts), which is worth a note."""
    if given is not None:
        return GivenVersion(given), False
    if config.kubernetes_version is not None:
        return GivenVersion(config.kubernetes_version), False
    annotated = any(
        IN_PLACE_KEY in mapping(mapping(o.get("metadata")).get("annotations")) for o in objects
    )
    return GivenVersion(ASSUMED_VERSION), annotated or config.has_default("in-place-exit-codes")
