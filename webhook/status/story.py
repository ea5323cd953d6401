"""A workload's story between attempts, from what was read (``webhook.status.reader``).

Nothing here is worked out a second way: the plan is ``explain``'s (``explained``), a failed
pod is counted or ignored by the one podFailurePolicy evaluation (``attempts``), its
cause and node are the failure history's, the budgets are counted as the Job controller
and the webhook's controller count them (``jobs``, ``workloads``, ``causes``), and the next
attempt is the pod the Job controller would create now as the webhook would give it
(``nextattempt``). This module puts them together (``tell``); ``model`` holds the values.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.cluster.version import version_for
from webhook.kinds.story import Controlled, Decision, Made, StoryFacts
from webhook.kube.objects import items, mapping
from webhook.kube.versions import KubeVersion
from webhook.policy.config import Config
from webhook.status import audit as audit_
from webhook.status.causes import Causes, causes_of, disruption_budgets, next_disruption
from webhook.status.events import events_of
from webhook.status.explained import (
    Readmit,
    applied_record,
    as_stored,
    explained_of,
    origin_of,
    recorded_config,
    without_ours,
)
from webhook.status.jobs import job_story, next_group
from webhook.status.model import (
    Attempt,
    Delay,
    EventLine,
    JobStory,
    Lookups,
    MemoryChange,
    NextAttempt,
    Story,
)
from webhook.status.nextattempt import LiveAttempts, delay_of
from webhook.status.reader import Tree, facts_of


def tell(
    tree: Tree,
    config: Config | None = None,
    lookups: Lookups | None = None,
    now: float | None = None,
    kubernetes_version: KubeVersion | None = None,
    readmit: Readmit | None = None,
) -> Story:
    """The whole story; ``config`` is the cluster defaults file when an admin gives one,
    ``kubernetes_version`` the cluster's (its ``/version``), which in-place restarts are
    judged by, as the webhook judges them (the config's pin first); ``readmit``, how a
    plan recorded before the record kept its rules' origins is found (``explained_of``)."""
    lookups = lookups if lookups is not None else Lookups()
    now = now if now is not None else dt.datetime.now(dt.timezone.utc).timestamp()
    workload = tree.workload
    meta = mapping(workload.get("metadata"))
    namespace = str(meta.get("namespace") or "")
    explained = tree.made if tree.made is not None else workload
    judged_by = config if config is not None else recorded_config(explained)
    assumed = ""
    if judged_by.kubernetes_version is None:
        version, assumed_ = version_for(kubernetes_version, judged_by, [explained])
        judged_by = dataclasses.replace(judged_by, kubernetes_version=version.version)
        if assumed_:
            assumed = (
                f"the cluster's Kubernetes version was not read: in-place restarts are "
                f"judged for Kubernetes {version.version}"
            )
    told, source, notes = explained_of(explained, judged_by, namespace, config is not None, readmit)
    notes += [assumed] if assumed else []
    story = Story(
        kind=tree.kind.kind,
        api_version=str(workload.get("apiVersion") or tree.kind.api_version),
        namespace=namespace,
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        state=state_of(tree),
        explained=told,
        explained_by=source,
        notes=notes,
        unread=list(tree.unread),
        older_jobs=list(tree.older_jobs),
    )
    record = applied_record(explained)
    told_kind = tree.made_kind if tree.made_kind is not None else tree.kind
    facts = facts_of(told_kind)
    story.budgets = facts.budgets(explained) if facts.budgets is not None else []
    story.decision = facts.decision(explained) if facts.decision is not None else None
    causes: Causes | None = None  # a set's: its record counts its Jobs' pods
    if facts.counts_its_pods:
        name = mapping(explained.get("metadata")).get("name")
        causes = causes_of(explained, f"{told_kind.kind} {name}")
        running = state_of(tree) in ("Running", "Pending")
        counted = disruption_budgets(causes, running)
        story.budgets += counted
        story.next_disruption = next_disruption(causes, counted) if running else []
    source_of_next = LiveAttempts(tree, lookups)
    nexts: set[str] = set()
    for job in tree.jobs:
        told = job_story(job, tree, record, judged_by, source_of_next, now, causes)
        group = next_group(job)
        if told.next is not None and group in nexts:
            told.next = None  # one replacement per replicated Job is enough to show
        elif told.next is not None:
            nexts.add(group)
        story.jobs.append(told)
    if story.decision is not None and story.decision.condition == "Failed":
        story.notes.extend(_first_failed(facts, story.decision, story.jobs))
    story.events = events_of(tree.events)
    story.audit = audit_.audit_lines(tree.auditor or tree.workload, tree.jobs)
    story.notes.extend(lookups.notes)
    story.notes.extend(_missing(tree, facts_of(tree.kind)))
    return story


def _missing(tree: Tree, facts: StoryFacts) -> list[str]:
    """What is said when none of the workload's Jobs (or what is made for it) exists: a
    list of Jobs only when it was read whole; what is made for it whenever it was not
    found (so far: there is nothing between the two otherwise)."""
    if not facts.missing or tree.jobs:
        return []
    if isinstance(facts.children, Controlled) and tree.unread:
        return []
    if isinstance(facts.children, Made) and tree.made is not None:
        return []
    return [facts.missing]


def state_of(tree: Tree) -> str:
    """The workload's state in a word: as its kind's facts read it, else from the
    conditions of what is told (it, or what is made for it)."""
    state = facts_of(tree.kind).state
    if state is not None:
        return state(tree.workload)
    return _conditions_state(tree.made if tree.made is not None else tree.workload, tree.jobs)


def _conditions_state(obj: Mapping[str, Any], jobs: Sequence[Any]) -> str:
    for condition in items(mapping(obj.get("status")).get("conditions")):
        if mapping(condition).get("status") != "True":
            continue
        kind_of = mapping(condition).get("type")
        if kind_of in ("Completed", "Complete"):
            return "Succeeded"
        if kind_of == "Failed":
            return "Failed"
        if kind_of == "Suspended":
            return "Suspended"
    return "Running" if jobs else "Pending"


def _first_failed(facts: StoryFacts, decision: Decision, jobs: Sequence[JobStory]) -> list[str]:
    """What ended the first failed Job of a failed set, when its message names that Job
    (``StoryFacts.first_failed``) and it is still there."""
    found = facts.first_failed.search(decision.message) if facts.first_failed else None
    job = next((j for j in jobs if found and j.name == found.group("job")), None)
    if job is None or job.decision is None:
        return []
    said = job.decision
    text = f"its first failed Job, {job.name}, failed with reason {said.reason}"
    if said.rule is not None:
        text += f": podFailurePolicy rule {said.rule + 1} ({said.action}), {said.origin}"
        text += f" (annotation {said.annotation})" if said.annotation else ""
    return [text]


__all__ = [
    "Attempt",
    "Delay",
    "EventLine",
    "JobStory",
    "Lookups",
    "MemoryChange",
    "NextAttempt",
    "Readmit",
    "Story",
    "applied_record",
    "as_stored",
    "delay_of",
    "events_of",
    "origin_of",
    "recorded_config",
    "tell",
    "without_ours",
]
