"""How ``status`` tells a JobSet's story: restarted as a set, by the Jobs labelled with its
name (``labelAndAnnotateObject`` in jobset pkg/controllers/jobset_controller.go); its
record counts the disruptions of all its Jobs' pods."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from webhook.cluster.record import Record
from webhook.kinds.jobset.replay import replay_jobset
from webhook.kinds.jobset.rules import RULE_NAME
from webhook.kinds.story import (
    Budget,
    Decision,
    Labelled,
    Replayed,
    StoryFacts,
    as_int,
    final_condition,
    subject,
    used_text,
)
from webhook.kube.objects import mapping
from webhook.kube.wellknown import JOBSET_NAME, JOBSET_UID, RESTART_ATTEMPT
from webhook.plan.audit import AuditRecord

KIND = "JobSet"

#: How JobSet names the Job whose failure ended it (``messageWithFirstFailedJob`` in jobset
#: pkg/controllers/jobset_controller.go).
FIRST_FAILED = re.compile(r"\(first failed job: (?P<job>[^)\s]+)\)")


def jobset_budgets(jobset: Mapping[str, Any]) -> list[Budget]:
    spec = mapping(jobset.get("spec"))
    status = mapping(jobset.get("status"))
    policy = spec.get("failurePolicy")
    restarts = as_int(status.get("restarts"))
    counted = status.get("restartsCountTowardsMax")
    counted = as_int(counted) if counted is not None else restarts
    name = subject(KIND, jobset)
    if not isinstance(policy, dict):
        return [
            Budget(
                name,
                "spec.failurePolicy",
                0,
                restarts,
                "no failurePolicy: the first Job that fails fails the JobSet",
            )
        ]
    limit = as_int(policy.get("maxRestarts"))
    text = f"maxRestarts {limit}: {used_text(counted, limit, 'restart')}"
    if restarts != counted:
        text += f" ({restarts} in all; {restarts - counted} by rules that do not count)"
    return [Budget(name, "spec.failurePolicy.maxRestarts", limit, counted, text)]


def jobset_decision(jobset: Mapping[str, Any]) -> Decision | None:
    return final_condition(jobset, subject(KIND, jobset), ("Completed",))


def replay(jobset: Mapping[str, Any]) -> Replayed | None:
    """Its audit, told as a whole from its own record once it has ended
    (``webhook.kinds.jobset.replay``): its child Jobs are its runs' parts."""
    audit = AuditRecord.of(jobset)
    return replay_jobset(jobset, audit, Record.of(jobset)) if audit is not None else None


STORY = StoryFacts(
    # The set's own Jobs: controlled by it (or, JobSet >= v0.9.0, labelled with its UID).
    Labelled(JOBSET_NAME, JOBSET_UID),
    budgets=jobset_budgets,
    decision=jobset_decision,
    counts_its_pods=True,
    first_failed=FIRST_FAILED,
    replay=replay,
    rules_at=("spec", "failurePolicy"),
    rule_names=(RULE_NAME,),
    run_label=RESTART_ATTEMPT,
)
