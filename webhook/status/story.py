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
import re
from collections.abc import Sequence

from webhook.cluster.version import version_for
from webhook.kube.objects import mapping
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
    Budget,
    Decision,
    Delay,
    EventLine,
    JobStory,
    Lookups,
    MemoryChange,
    NextAttempt,
    Story,
)
from webhook.status.nextattempt import LiveAttempts, delay_of
from webhook.status.reader import Tree
from webhook.status.workloads import (
    final_condition,
    job_state,
    jobset_budgets,
    jobset_decision,
    rayjob_budgets,
    rayjob_decision,
    state_of,
)


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
    explained = tree.jobset if tree.jobset is not None else workload
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
    causes: Causes | None = None  # a JobSet's: the set's record counts its pods
    if tree.kind.kind == "JobSet" or tree.jobset is not None:
        jobset = tree.jobset if tree.jobset is not None else workload
        story.budgets = jobset_budgets(jobset)
        story.decision = jobset_decision(jobset)
        causes = causes_of(jobset, f"JobSet {mapping(jobset.get('metadata')).get('name')}")
        running = state_of(tree) in ("Running", "Pending")
        counted = disruption_budgets(causes, running)
        story.budgets += counted
        story.next_disruption = next_disruption(causes, counted) if running else []
    elif tree.kind.kind == "RayJob":
        story.budgets = rayjob_budgets(workload)
        story.decision = rayjob_decision(workload)
        if not tree.jobs:
            story.notes.append(
                "no submitter Job of this RayJob exists now (KubeRay makes one per attempt "
                "in K8sJobMode)"
            )
    elif tree.kind.kind == "TrainJob":
        story.decision = final_condition(workload, f"TrainJob {story.name}", ("Complete",))
        story.notes.append("the trainer has not made this TrainJob's JobSet (yet)")
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
        story.notes.extend(_first_failed(story.decision, story.jobs))
    story.events = events_of(tree.events)
    story.audit = audit_.audit_lines(tree.cronjob or tree.workload, tree.jobs)
    story.notes.extend(lookups.notes)
    if tree.kind.kind == "CronJob" and not tree.jobs and not tree.unread:
        story.notes.append("no Job of this CronJob exists now")
    return story


#: How JobSet names the Job whose failure ended it (``messageWithFirstFailedJob`` in jobset
#: pkg/controllers/jobset_controller.go).
_FIRST_FAILED = re.compile(r"\(first failed job: (?P<job>[^)\s]+)\)")


def _first_failed(decision: Decision, jobs: Sequence[JobStory]) -> list[str]:
    """What ended the first failed Job of a failed JobSet, when that Job is still there."""
    found = _FIRST_FAILED.search(decision.message)
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
    "Budget",
    "Decision",
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
    "job_state",
    "origin_of",
    "recorded_config",
    "tell",
    "without_ours",
]
