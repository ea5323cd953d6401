"""What ``status`` tells a workload's story with, kind by kind: each kind's facts
(``StoryFacts``, in ``kinds/<kind>/story.py``, named by its ``KindSpec.story``) and the
values they build (``Budget``, ``Decision``), which ``status`` shows.

A kind's facts say how its Jobs are found (``Children``), how its own state, budgets and
decision read from what its controller wrote, and what is said when none of its Jobs is
there. What every kind's Jobs share (the Job controller's conditions: ``job_state``,
``final_condition``) is here too. Nothing here runs on the admission path
(``tests/kinds/test_registry.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from webhook.kube.jobcontroller import exceeds_backoff_limit
from webhook.kube.objects import items, mapping

# --- the values a kind's story is told with ----------------------------------------------


@dataclass
class DisruptionBudget:
    free: int
    counted: int
    index: int | None
    next: str | None


@dataclass
class Budget:
    what: str
    field: str
    limit: int | None
    used: int
    text: str
    #: ``max-disruptions`` only: the disruptions free and counted, the index (an Indexed
    #: Job's with a budget per index), and what the next one does ("free", "counted";
    #: ``None`` when the workload has ended).
    disruptions: DisruptionBudget | None = None


@dataclass
class Decision:
    """Why a finished (or finishing) object ended: its condition, and for a Job failed by
    its podFailurePolicy, the rule and who wrote it."""

    subject: str
    condition: str
    reason: str
    message: str
    time: str | None = None
    rule: int | None = None
    action: str | None = None
    origin: str | None = None
    annotation: str | None = None
    pod: str | None = None
    container: str | None = None
    exit_code: int | None = None
    pod_condition: str | None = None


# --- how a workload's Jobs are found -------------------------------------------------------


@dataclass(frozen=True)
class OwnJob:
    """The workload is its one Job."""


@dataclass(frozen=True)
class Controlled:
    """The namespace's Jobs the workload controls (ownerReference: its controller sets no
    label of its own), the ``latest`` few by creation."""

    latest: int


@dataclass(frozen=True)
class Labelled:
    """The Jobs labelled ``name_label=<its name>``, kept when it controls them or they carry
    ``uid_label=<its uid>``."""

    name_label: str
    uid_label: str


@dataclass(frozen=True)
class Made:
    """The object of this kind its controller makes for it, named as it and controlled by
    it: a Job is its Job; another kind is told in its place, its Jobs found by its own
    facts."""

    group: str
    version: str
    kind: str


Children = OwnJob | Controlled | Labelled | Made


class Replayed(Protocol):
    """What audited defaults would have done to a workload told as a whole (its
    ``RetryPolicyAudit`` Event's sentence)."""

    verdict: str
    saved: Mapping[str, float]

    def sentence(self) -> str: ...


@dataclass(frozen=True)
class StoryFacts:
    """What ``status`` tells one kind's story with."""

    #: How the Jobs its story is told by are found.
    children: Children
    #: Its own state in a word from its status; ``None``: from its conditions (Complete or
    #: Completed, Failed, Suspended), else Running while it has Jobs, else Pending.
    state: Callable[[Mapping[str, Any]], str] | None = None
    #: Its own budgets (not its Jobs'), as its controller counts them.
    budgets: Callable[[Mapping[str, Any]], list[Budget]] | None = None
    #: Why it ended (``None``: it has not).
    decision: Callable[[Mapping[str, Any]], Decision | None] | None = None
    #: Said when none of its Jobs (or what is made for it) exists now.
    missing: str = ""
    #: Its record counts the disruptions of all its Jobs' pods (the set's budget).
    counts_its_pods: bool = False
    #: How its message names the Job whose failure ended it (group ``job``).
    first_failed: re.Pattern[str] | None = None
    #: The role of one of its Jobs, in words ("created <time>").
    role: Callable[[Mapping[str, Any]], str] | None = None
    #: Its Jobs carry only its template's metadata: its audit record is theirs.
    audits_its_jobs: bool = False
    #: Its audit replayed as a whole, from its own record (``None``: not audited, or
    #: nothing to tell yet); a kind without one is told Job by Job.
    replay: Callable[[Mapping[str, Any]], Replayed | None] | None = None
    #: Where its own rules are, besides its JobSpecs' podFailurePolicy (a set's failure
    #: policy): the webhook's among them are told as the webhook's.
    rules_at: tuple[str, ...] = ()
    #: The names of the rules the webhook writes there for fail-non-retriable (how a
    #: version-1 record, which keeps no rules' origins, is read).
    rule_names: tuple[str, ...] = ()
    #: The label its Jobs' pods carry their run by: a pod's attempts are its runs.
    run_label: str = ""
    #: Served by every API server (not a custom resource, whose CRD may be missing).
    built_in: bool = False


# --- what every kind's Jobs share: the Job controller's conditions ------------------------

#: A Job's conditions that end it, then those that say it is ending (pods terminating).
FINAL = {"Failed": "Failed", "Complete": "Succeeded"}
ENDING = {"FailureTarget": "Failing", "SuccessCriteriaMet": "Succeeding"}


def job_state(job: Mapping[str, Any]) -> str:
    """Succeeded, Failed, Succeeding or Failing (ending, pods terminating), Suspended,
    Running or Pending, from the conditions and counts the Job controller writes."""
    status = mapping(job.get("status"))
    conditions = [mapping(c) for c in items(status.get("conditions"))]
    for names in (FINAL, ENDING):
        for condition in conditions:
            if condition.get("status") == "True" and condition.get("type") in names:
                return names[str(condition["type"])]
    if mapping(job.get("spec")).get("suspend") is True:
        return "Suspended"
    return "Running" if (status.get("active") or 0) > 0 else "Pending"


def final_condition(obj: Mapping[str, Any], subject: str, done: Sequence[str]) -> Decision | None:
    for condition in items(mapping(obj.get("status")).get("conditions")):
        condition = mapping(condition)
        if condition.get("status") == "True" and condition.get("type") in ("Failed", *done):
            return Decision(
                subject,
                str(condition.get("type")),
                str(condition.get("reason") or ""),
                str(condition.get("message") or ""),
                condition.get("lastTransitionTime"),
            )
    return None


def retries_left(used: int, limit: int) -> str:
    """``used`` counted failures against ``limit``, in words: over the budget once they
    exceed it (the Job controller's ``exceedsBackoffLimit``, and KubeRay's, which retries
    while ``failed < backoffLimit + 1``)."""
    failures_text = f"{used} counted failure{'' if used == 1 else 's'}"
    if exceeds_backoff_limit(used, limit):
        return f"{failures_text}: over the budget"
    left = limit - used
    return f"{failures_text}, {left} retr{'y' if left == 1 else 'ies'} left"


def used_text(used: int, limit: int, noun: str) -> str:
    left = max(0, limit - used)
    return f"{used} {noun}{'' if used == 1 else 's'} used, {left} left"


def as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def subject(kind: str, obj: Mapping[str, Any]) -> str:
    """``obj`` as a budget or a decision names it: "JobSet train"."""
    return f"{kind} {mapping(obj.get('metadata')).get('name')}"
