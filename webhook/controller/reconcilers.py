"""The reconcilers a leading controller runs, built from its cluster connection."""

from __future__ import annotations

from typing import Any

from webhook.controller.manager import ControllerOptions, Reconciler
from webhook.controller.recorder import HistoryRecorder


def build(api_client: Any, options: ControllerOptions) -> list[Reconciler]:
    """Every reconciler, sharing one API client (and its connection pool)."""
    return [HistoryRecorder(api_client)]
