"""The controller's services handed to what each kind's folder says its controller does
(``webhook.kinds.services``), and those parts built from the kinds' list: the controller
names no kind here, each kind declares its part in its ``KindSpec``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from webhook.controller.ratelimit import critical
from webhook.controller.records import workload_of
from webhook.controller.writes import persist
from webhook.kinds.registry import KINDS
from webhook.kinds.services import PeerWriter, Services

SERVICES = Services(persist=persist, critical=critical, workload_of=workload_of)


class PeerWriters:
    """Every kind's ``PeerWriter`` as one: the first that answers for a pod."""

    def __init__(
        self, api_client: Any, workloads: Any, events: Any, writes: Any, clock: Callable[[], float]
    ) -> None:
        self.writers: list[PeerWriter] = [
            spec.peers.load()(api_client, workloads, events, writes, clock, SERVICES)
            for spec in KINDS
            if spec.peers is not None
        ]

    def fail_job(self, pod: Mapping[str, Any], cause: str) -> str | None:
        for writer in self.writers:
            result = writer.fail_job(pod, cause)
            if result is not None:
                return result
        return None
