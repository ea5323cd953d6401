"""The reconcilers a leading controller runs, built from its cluster connection."""

from __future__ import annotations

import os
import socket
from typing import Any

from webhook.cluster.events import EventRecorder
from webhook.controller.disruptions import Disruptions
from webhook.controller.manager import ControllerOptions, Reconciler
from webhook.controller.recorder import HistoryRecorder
from webhook.controller.restarts import InPlaceBudget


def build(api_client: Any, options: ControllerOptions, metrics: Any = None) -> list[Reconciler]:
    """Every reconciler, sharing one API client (and its connection pool); ``metrics`` is
    the controller's (``webhook.serving.metrics.ControllerMetrics``)."""
    return [HistoryRecorder(api_client), *budget_reconcilers(api_client, metrics)]


def budget_reconcilers(api_client: Any, metrics: Any = None) -> list[Reconciler]:
    """The budgets per cause (``webhook.mutators.budgets``), with the Events they write."""
    from kubernetes import client

    instance = os.environ.get("POD_NAME") or socket.gethostname()
    events = EventRecorder(client.EventsV1Api(api_client), instance)
    return [Disruptions(api_client, events, metrics), InPlaceBudget(api_client, events, metrics)]
