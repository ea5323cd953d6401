"""The webhook's Events about a workload, as the story lists them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.kinds.story import as_int
from webhook.kube.objects import mapping
from webhook.status.attempts import utc_time
from webhook.status.model import EventLine

# --- Events -----------------------------------------------------------------------------


def events_of(events: Sequence[Mapping[str, Any]]) -> list[EventLine]:
    """Our Events, oldest first, each with its series count (how often it happened)."""
    lines = []
    for event in events:
        series = mapping(event.get("series"))
        count = series.get("count") or event.get("deprecatedCount") or 1
        when = (
            event.get("eventTime")
            or event.get("deprecatedFirstTimestamp")
            or mapping(event.get("metadata")).get("creationTimestamp")
            or ""
        )
        regarding = mapping(event.get("regarding"))
        parsed = _sortable(str(when))
        lines.append(
            EventLine(
                time=utc_time(parsed) or str(when) if parsed else str(when),
                type=str(event.get("type") or ""),
                reason=str(event.get("reason") or ""),
                note=str(event.get("note") or ""),
                count=as_int(count) or 1,
                regarding=f"{regarding.get('kind')}/{regarding.get('name')}",
            )
        )
    lines.sort(key=lambda e: (_sortable(e.time), e.reason))
    return lines


def _sortable(raw: str) -> float:
    try:
        return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
