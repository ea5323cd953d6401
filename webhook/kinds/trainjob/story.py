"""How ``status`` tells a TrainJob's story: by the JobSet the trainer makes for it (same
name, controlled by the TrainJob), told in its place; before there is one, by its own
conditions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kinds.story import Decision, Made, StoryFacts, final_condition
from webhook.kinds.trainjob.mutate import KIND
from webhook.kube.objects import mapping
from webhook.kube.wellknown import JOBSET_GROUP, JOBSET_VERSION


def trainjob_decision(trainjob: Mapping[str, Any]) -> Decision | None:
    name = str(mapping(trainjob.get("metadata")).get("name") or "")
    return final_condition(trainjob, f"{KIND} {name}", ("Complete",))


STORY = StoryFacts(
    Made(JOBSET_GROUP, JOBSET_VERSION, "JobSet"),
    decision=trainjob_decision,
    missing="the trainer has not made this TrainJob's JobSet (yet)",
)
