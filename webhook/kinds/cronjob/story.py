"""How ``status`` tells a CronJob's story: by the latest few of the Jobs it controls
(ownerReference: the CronJob controller sets no label of its own), each by when it was
made, and its Jobs' audit record is its own (they get only the jobTemplate's metadata,
``getJobFromTemplate2`` in pkg/controller/cronjob/utils.go)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kinds.story import Controlled, StoryFacts
from webhook.kube.objects import items, mapping

#: Its Jobs shown: the latest ones (by creation).
LATEST_JOBS = 3


def cronjob_state(cronjob: Mapping[str, Any]) -> str:
    spec = mapping(cronjob.get("spec"))
    active = items(mapping(cronjob.get("status")).get("active"))
    if spec.get("suspend") is True:
        return "Suspended"
    return f"Active ({len(active)} Job(s) running)" if active else "Waiting for its schedule"


def role(job: Mapping[str, Any]) -> str:
    """One of its Jobs, by when it was made."""
    return f"created {mapping(job.get('metadata')).get('creationTimestamp') or ''}"


STORY = StoryFacts(
    Controlled(LATEST_JOBS),
    state=cronjob_state,
    missing="no Job of this CronJob exists now",
    role=role,
    audits_its_jobs=True,
    built_in=True,
)
