"""The reconcilers a leading controller runs, built from its cluster connection."""

from __future__ import annotations

from typing import Any

from webhook.controller.gates import GateReleaser
from webhook.controller.manager import ControllerOptions, Reconciler


def build(api_client: Any, options: ControllerOptions, recorder: Any = None) -> list[Reconciler]:
    """Every reconciler, sharing one API client (and its connection pool); ``recorder``
    is the controller's metrics (``webhook.serving.metrics.ControllerMetrics``)."""
    from kubernetes import client

    return [GateReleaser(client.CoreV1Api(api_client), recorder)]
