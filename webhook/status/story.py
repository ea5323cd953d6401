"""A workload's story between attempts, from what was read (``webhook.status.reader``).

Nothing here is worked out a second way: the plan is ``explain``'s, a failed pod is
counted or ignored by the one podFailurePolicy evaluation (``failurepolicy.evaluate``,
as the Job controller and the attempt cache count), its cause and node are the failure
history's (``failure_cause``, ``killed_at``, ``failed_node``, ``disruption``), and the
next attempt is the pod the Job controller would create now, admitted by the real pod
mutator (``engine.review``) with an attempt source built from the Job and its pods as
read, so its memory, nodes avoided and non-spot placement are what the webhook would give
it.

The plan is judged without the cluster's defaults file (a user cannot read it): from the
workload's annotations and the ``retry-policy.dev/applied`` record the webhook wrote at
admission, whose settings that no annotation made are taken as the admins' defaults.
``--config`` gives the real file instead.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook import explain
from webhook.admission import engine
from webhook.cluster import history as failures
from webhook.cluster.attempts import (
    AttemptLookup,
    job_failed_count,
    placement_budget,
    terminating_pods,
)
from webhook.cluster.conditions import condition as pod_condition
from webhook.cluster.conditions import label_value
from webhook.cluster.deletions import REASON as DELETION_BY_DISRUPTOR
from webhook.cluster.history import FailureHistory, HistoryKey, HistoryLookup
from webhook.cluster.limits import LimitLookup
from webhook.cluster.nodes import NodeAnswer
from webhook.cluster.record import Record
from webhook.cluster.version import version_for
from webhook.kinds.jobset.rules import RULE_NAME
from webhook.kube import failurepolicy, podspec
from webhook.kube.failurepolicy import PodFailure
from webhook.kube.gates import GATE as RETRY_DELAY_GATE
from webhook.kube.gates import NOT_BEFORE
from webhook.kube.jobcontroller import parse_failjob_message, pod_from_template
from webhook.kube.objects import items, mapping
from webhook.kube.restartrules import restarts
from webhook.kube.scheduling import Placement
from webhook.kube.versions import KubeVersion
from webhook.kube.wellknown import (
    COMPLETION_INDEX,
    JOB_UID_LABEL,
    JOBSET_JOB_INDEX,
    REPLICATED_JOB,
    RESTART_ATTEMPT,
)
from webhook.plan import causes as per_cause
from webhook.plan.causes import (
    MAX_DISRUPTIONS_LABEL,
    MAX_RESTARTS_LABEL,
    PEERS_LABEL,
    disruption_scope,
)
from webhook.plan.policies import has_policy_annotations
from webhook.plan.record import AppliedRecord
from webhook.policy.config import Config, ConfigError, parse_config
from webhook.policy.model import APPLIED, PREFIX, parse_count, parse_restart_budget
from webhook.status import audit as audit_
from webhook.status.reader import Tree

#: A Job's conditions that end it, then those that say it is ending (pods terminating).
_FINAL = {"Failed": "Failed", "Complete": "Succeeded"}
_ENDING = {"FailureTarget": "Failing", "SuccessCriteriaMet": "Succeeding"}

#: ``retry-policy.dev/applied`` record key -> the annotations it stands for.
_RECORDED = {
    "backoffLimit": "backoff-limit",
    "onNonRetriable": "on-non-retriable",
    "nonSpotAttempts": "non-spot-attempts",
    "errorPropagation": "error-propagation",
    "oomMemoryFactor": "oom-memory-factor",
    "oomMemoryLimit": "oom-memory-limit",
    "inPlaceScope": "in-place-scope",
    "maxDisruptions": "max-disruptions",
    "maxInPlaceRestarts": "max-in-place-restarts",
    "peerDisruptions": "peer-disruptions",
}

#: The rules on our controller's conditions (``webhook.plan.causes.rules``): the
#: record key that says the webhook wrote one, its annotation, and the condition.
_CONDITION_RULES = (
    ("maxInPlaceRestarts", "max-in-place-restarts", failurepolicy.IN_PLACE_BUDGET_EXHAUSTED),
    ("maxDisruptions", "max-disruptions", failurepolicy.DISRUPTION_BUDGET_EXHAUSTED),
    ("peerDisruptions", "peer-disruptions", failurepolicy.PEER_DISRUPTED),
)


# --- the model -------------------------------------------------------------------------


@dataclass
class DisruptionCount:
    """How the controller counted a disrupted pod against ``max-disruptions``."""

    #: "free", "counted" (over the budget), or ``None``: not in the workload's record
    #: (the controller has not counted it, or not yet written the count).
    result: str | None
    limit: int
    #: Its number (from its ``DisruptionBudgetExhausted`` condition); ``None`` for a free one.
    number: int | None = None
    #: Whether it carries ``retry-policy.dev/DisruptionBudgetExhausted``.
    marked: bool = False
    #: Over the budget but ``Failed`` before it could be marked (the record's late marks):
    #: "lowered" (the controller lowered the Job's backoffLimit for it), "other" (its
    #: rules counted it, or nothing could be lowered), ``None``: neither.
    late: str | None = None


@dataclass
class PeerMark:
    """A pod marked ``retry-policy.dev/PeerDisrupted``: whose disruption, and the setting."""

    peer: str | None
    cause: str | None
    #: ``peer-disruptions`` as the pod's label says: "ignore" or "count".
    setting: str | None
    #: Whether the rule on PeerDisrupted decided the failed pod (not an earlier rule).
    by_rule: bool = False


@dataclass
class InPlace:
    """A pod's restarts in place (as ``max-in-place-restarts`` counts them)."""

    restarts: int
    limit: int | None
    #: Marked ``retry-policy.dev/InPlaceBudgetExhausted``: replaced for using its budget.
    replaced: bool = False


@dataclass
class Attempt:
    """One pod of a Job: a failed attempt (``counted`` says whether the Job controller
    counts it), or the attempt running now."""

    pod: str
    job: str
    phase: str
    node: str | None
    created: str
    index: int | None = None
    #: ``failure_cause``'s grammar: ``oom-killed:<c>``, ``exit-code:<n>:<c>``,
    #: ``disruption``; "" when it cannot be told.
    cause: str = ""
    container: str | None = None
    exit_code: int | None = None
    disruption: str | None = None
    finished: str | None = None
    counted: bool | None = None
    #: The podFailurePolicy rule that matched (0-based index into the Job's rules).
    rule: int | None = None
    action: str | None = None
    #: Whether ``avoid-failed-nodes`` counts its node as one where it failed.
    node_failed: bool = False
    #: What the webhook recorded on the pod at its admission.
    applied: dict[str, Any] = field(default_factory=dict)
    #: A JobSet's pod: the run (``restart-attempt``) it belongs to.
    run: int | None = None
    #: The disruptor whose deletion of it the webhook marked a disruption.
    deleted_by: str | None = None
    disruption_count: DisruptionCount | None = None
    peer: PeerMark | None = None
    in_place: InPlace | None = None


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
class DisruptionBudget:
    free: int
    counted: int
    index: int | None
    next: str | None


@dataclass
class MemoryChange:
    container: str
    kind: str  # "request" or "limit"
    before: str | None
    after: str | None


@dataclass
class Delay:
    pod: str | None
    not_before: str
    seconds_left: int


@dataclass
class NextAttempt:
    """What a pod the Job creates now gets from the webhook."""

    job: str
    attempt: int | None
    attempts: int | None
    non_spot: bool | None
    memory: list[MemoryChange] = field(default_factory=list)
    avoided_nodes: list[str] = field(default_factory=list)
    avoided_by: str | None = None
    delay: Delay | None = None
    #: The warnings the pod's admission gives (what kubectl would show), and notes.
    changes: list[str] = field(default_factory=list)
    #: What ``attempt`` counts: a Job's attempts, or (a JobSet's pod) the set's runs.
    unit: str = "attempt"


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


@dataclass
class JobStory:
    name: str
    uid: str
    state: str
    counted: int
    ignored: int
    budgets: list[Budget] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    next: NextAttempt | None = None
    decision: Decision | None = None
    #: JobSet: which replicated Job it is; CronJob: when it was scheduled.
    role: str = ""
    notes: list[str] = field(default_factory=list)
    #: What the next disruption does, in words (``max-disruptions``, while it runs).
    next_disruption: list[str] = field(default_factory=list)


@dataclass
class EventLine:
    time: str
    type: str
    reason: str
    note: str
    count: int
    regarding: str


@dataclass
class Story:
    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str
    state: str
    plan: list[explain.Explanation | explain.Denial]
    plan_source: str
    budgets: list[Budget] = field(default_factory=list)
    jobs: list[JobStory] = field(default_factory=list)
    decision: Decision | None = None
    events: list[EventLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: What could not be read (the story is shown without it).
    unread: list[str] = field(default_factory=list)
    #: A CronJob's Jobs not shown (older than the latest few).
    older_jobs: list[str] = field(default_factory=list)
    #: A JobSet's: what its next disruption does (its budget is the set's).
    next_disruption: list[str] = field(default_factory=list)
    #: What audited defaults would have done to each ended Job (``webhook.status.audit``).
    audit: list[audit_.AuditLine] = field(default_factory=list)


class Lookups:
    """What the next attempt's admission asks besides the Job and its pods; this one
    answers as the offline CLI does (no LimitRanges, Nodes unknown)."""

    core_api: Any = None
    #: What the story should say about these answers (a list the user may not read).
    notes: list[str]

    def __init__(self) -> None:
        self.notes = []

    def limit_ranges(self, namespace: str) -> LimitLookup:
        return LimitLookup(True)

    def placement(self, question: Placement) -> NodeAnswer:
        return NodeAnswer(False, reason="no Nodes are read here")


# --- the story -------------------------------------------------------------------------


def tell(
    tree: Tree,
    config: Config | None = None,
    lookups: Lookups | None = None,
    now: float | None = None,
    kubernetes_version: KubeVersion | None = None,
) -> Story:
    """The whole story; ``config`` is the cluster defaults file when an admin gives one,
    ``kubernetes_version`` the cluster's (its ``/version``), which in-place restarts are
    judged by, as the webhook judges them (the config's pin first)."""
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
    plan, source, notes = _plan(explained, judged_by, namespace, given=config is not None)
    notes += [assumed] if assumed else []
    story = Story(
        kind=tree.kind.kind,
        api_version=str(workload.get("apiVersion") or tree.kind.api_version),
        namespace=namespace,
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        state=_state(tree),
        plan=plan,
        plan_source=source,
        notes=notes,
        unread=list(tree.unread),
        older_jobs=list(tree.older_jobs),
    )
    record = applied_record(explained)
    causes: _Causes | None = None  # a JobSet's: the set's record counts its pods
    if tree.kind.kind == "JobSet" or tree.jobset is not None:
        jobset = tree.jobset if tree.jobset is not None else workload
        story.budgets = _jobset_budgets(jobset)
        story.decision = _jobset_decision(jobset)
        causes = _causes(jobset, f"JobSet {mapping(jobset.get('metadata')).get('name')}")
        running = _state(tree) in ("Running", "Pending")
        counted = _disruption_budgets(causes, running)
        story.budgets += counted
        story.next_disruption = _next_disruption(causes, counted) if running else []
    elif tree.kind.kind == "RayJob":
        story.budgets = _rayjob_budgets(workload)
        story.decision = _rayjob_decision(workload)
        if not tree.jobs:
            story.notes.append(
                "no submitter Job of this RayJob exists now (KubeRay makes one per attempt "
                "in K8sJobMode)"
            )
    elif tree.kind.kind == "TrainJob":
        story.decision = _final_condition(workload, f"TrainJob {story.name}", ("Complete",))
        story.notes.append("the trainer has not made this TrainJob's JobSet (yet)")
    source_of_next = _LiveAttempts(tree, lookups)
    nexts: set[str] = set()
    for job in tree.jobs:
        job_story = _job_story(job, tree, record, judged_by, source_of_next, now, causes)
        group = _next_group(job)
        if job_story.next is not None and group in nexts:
            job_story.next = None  # one replacement per replicated Job is enough to show
        elif job_story.next is not None:
            nexts.add(group)
        story.jobs.append(job_story)
    if story.decision is not None and story.decision.condition == "Failed":
        story.notes.extend(_first_failed(story.decision, story.jobs))
    story.events = events_of(tree.events)
    story.audit = audit_.audit_lines(tree.workload, tree.jobs)
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


def _state(tree: Tree) -> str:
    kind = tree.kind.kind
    obj = tree.jobset if tree.jobset is not None else tree.workload
    if kind == "Job":
        return job_state(tree.workload)
    if kind == "RayJob":
        return rayjob_state(tree.workload)
    if kind == "CronJob":
        spec = mapping(tree.workload.get("spec"))
        active = items(mapping(tree.workload.get("status")).get("active"))
        if spec.get("suspend") is True:
            return "Suspended"
        return f"Active ({len(active)} Job(s) running)" if active else "Waiting for its schedule"
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
    return "Running" if tree.jobs else "Pending"


#: A RayJob's ``status.jobDeploymentStatus`` (KubeRay, ray-operator/apis/ray/v1/
#: rayjob_types.go), as a state: terminal ones end it; every other is a run or a retry.
_RAYJOB_STATES = {"Failed": "Failed", "Suspended": "Suspended", "Suspending": "Suspended"}


def rayjob_state(rayjob: Mapping[str, Any]) -> str:
    """Succeeded (Complete, its Ray job SUCCEEDED), Failed, Suspended, Running or
    Pending (not deployed yet), from the status KubeRay writes."""
    status = mapping(rayjob.get("status"))
    deployment = str(status.get("jobDeploymentStatus") or "")
    if deployment == "Complete":
        return "Succeeded" if status.get("jobStatus") == "SUCCEEDED" else "Failed"
    return _RAYJOB_STATES.get(deployment, "Running" if deployment else "Pending")


def job_state(job: Mapping[str, Any]) -> str:
    """Succeeded, Failed, Succeeding or Failing (ending, pods terminating), Suspended,
    Running or Pending, from the conditions and counts the Job controller writes."""
    status = mapping(job.get("status"))
    conditions = [mapping(c) for c in items(status.get("conditions"))]
    for names in (_FINAL, _ENDING):
        for condition in conditions:
            if condition.get("status") == "True" and condition.get("type") in names:
                return names[str(condition["type"])]
    if mapping(job.get("spec")).get("suspend") is True:
        return "Suspended"
    return "Running" if (status.get("active") or 0) > 0 else "Pending"


# --- the plan ----------------------------------------------------------------------------


def applied_record(obj: Mapping[str, Any]) -> AppliedRecord:
    """The ``retry-policy.dev/applied`` record on ``obj`` (empty: none, or unreadable)."""
    return AppliedRecord.of(obj) or AppliedRecord({}, {}, 1)


def recorded_config(obj: Mapping[str, Any]) -> Config:
    """A config whose cluster defaults are the settings of the object's applied record
    that none of its annotations made (the admins' defaults at its admission)."""
    record = applied_record(obj)
    annotations = mapping(mapping(obj.get("metadata")).get("annotations"))
    written = {k.removeprefix(PREFIX) for k in annotations if isinstance(k, str)}
    defaults: dict[str, str] = {}
    for key, name in _RECORDED.items():
        if key in record:
            defaults[name] = str(record.get(key))
    for key, name in (
        ("ignoreDisruptions", "ignore-disruptions"),
        ("avoidFailedNodes", "avoid-failed-nodes"),
    ):
        if record.get(key) is True:
            defaults[name] = "true"
    codes = record.get("failNonRetriable")
    if isinstance(codes, list):
        defaults["fail-non-retriable"] = "true"
        defaults["retriable-exit-codes"] = ",".join(str(c) for c in codes)
    in_place = record.get("inPlaceExitCodes")
    if isinstance(in_place, list):
        defaults["in-place-exit-codes"] = ",".join(str(c) for c in in_place)
    chosen = {k: v for k, v in defaults.items() if k not in written}
    if not chosen:
        return Config()
    try:
        return parse_config(json.dumps({"defaults": chosen}), "<the applied record>")
    except ConfigError:
        return Config()


def ours(rule: Any, record: AppliedRecord) -> str | None:
    """The annotation for which this webhook wrote ``rule`` (a podFailurePolicy rule, or a
    JobSet failure policy rule), as the applied record says; ``None``: not ours. A record
    that keeps the rules' origins says so itself; an older one (version 1) by the shape of
    the rules its settings write."""
    if not isinstance(rule, dict):
        return None
    if record.version >= 2:
        return record.origin(rule)
    if "failNonRetriable" in record and (
        rule.get("name") == RULE_NAME
        or failurepolicy.is_non_retriable_rule(rule)
        or failurepolicy.rule_key(rule)
        == failurepolicy.rule_key(failurepolicy.count_disruptions_rule())
    ):
        return "fail-non-retriable"
    ignore = failurepolicy.rule_key(failurepolicy.ignore_disruptions_rule())
    if record.get("ignoreDisruptions") is True and failurepolicy.rule_key(rule) == ignore:
        return "ignore-disruptions"
    for key, name, kind in _CONDITION_RULES:
        if key not in record:
            continue
        action = "Ignore" if record.get(key) == "ignore" else "Count"
        if failurepolicy.rule_key(rule) == failurepolicy.rule_key(
            failurepolicy.condition_rule(kind, action)
        ):
            return name
    return None


#: Set by the API server or the controllers, not by whoever wrote the manifest.
_SYSTEM_METADATA = (
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "finalizers",
)


def as_stored(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object without its status and system fields: the spec as the controllers read
    it, with the metadata a manifest has."""
    out = copy.deepcopy(dict(obj))
    out.pop("status", None)
    meta = mapping(out.get("metadata"))
    for key in _SYSTEM_METADATA:
        meta.pop(key, None)
    return out


def _job_specs(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    kind = obj.get("kind")
    spec = mapping(obj.get("spec"))
    if kind == "Job":
        return [spec]
    if kind == "CronJob":
        return [mapping(mapping(spec.get("jobTemplate")).get("spec"))]
    if kind == "JobSet":
        return [
            mapping(mapping(mapping(r).get("template")).get("spec"))
            for r in items(spec.get("replicatedJobs"))
        ]
    return []


def without_ours(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with the rules the applied record says this webhook wrote taken out: what
    the re-admission adds back is then told as the webhook's, not the user's."""
    out = copy.deepcopy(dict(obj))
    record = applied_record(out)
    if not record.settings:
        return out
    for spec in _job_specs(out):
        policy = mapping(spec.get("podFailurePolicy"))
        rules = items(policy.get("rules"))
        kept = [r for r in rules if ours(r, record) is None]
        if rules and not kept:
            spec.pop("podFailurePolicy", None)
        elif rules:
            policy["rules"] = kept
    if out.get("kind") == "JobSet":
        policy = mapping(mapping(out.get("spec")).get("failurePolicy"))
        rules = items(policy.get("rules"))
        if rules:
            policy["rules"] = [r for r in rules if ours(r, record) is None]
    return out


def _plan(
    obj: Mapping[str, Any], config: Config, namespace: str, given: bool
) -> tuple[list[explain.Explanation | explain.Denial], str, list[str]]:
    """The plan of the object as stored. ``explain`` admits its input again, so the input
    is the first of these whose admission gives back exactly the stored spec (what the
    controllers read: ``podFailurePolicy`` is immutable): the object without the rules
    the webhook wrote (they are then told as the webhook's); as stored (every rule told
    as yours); without its retry-policy annotations, judged by the built-in defaults (the
    webhook would change it today: its settings are not shown)."""
    stored = as_stored(obj)
    source = (
        f"judged with {config.source}"
        if given
        else f"from the workload's annotations and its {APPLIED} record (what the webhook "
        "applied at admission); an admin can give the cluster's defaults file with --config"
    )
    bare = copy.deepcopy(stored)
    annotations = mapping(mapping(bare.get("metadata")).get("annotations"))
    for key in [k for k in annotations if isinstance(k, str) and k.startswith(PREFIX)]:
        del annotations[key]
    candidates = [
        (without_ours(stored), config, ""),
        (
            stored,
            config,
            "the plan reads the stored rules and cannot tell which of them the webhook wrote",
        ),
        (
            bare,
            Config(),
            "admitting this workload again would change it (its annotations, the defaults or "
            "the webhook changed since): the plan reads its stored spec as it is, without "
            "its retry-policy settings",
        ),
    ]
    chosen, judge, note = candidates[-1]
    for candidate, by, said in candidates:
        again = engine.review(copy.deepcopy(candidate), by, namespace)
        if again.verdict.allowed and again.result.get("spec") == stored.get("spec"):
            chosen, judge, note = candidate, by, said
            break
    notes = [note] if note else []
    try:
        result = explain.explain(copy.deepcopy(chosen), judge, namespace)
    except explain.ExplainError as err:
        return [], source, [*notes, f"no plan: {err}"]
    if result is None:
        return [], source, [*notes, f"explain does not cover a {obj.get('kind')}"]
    if isinstance(result, explain.Denial):
        return [result], source, notes
    return list(result), source, notes


# --- a RayJob: retried whole, on a new RayCluster ----------------------------------------


def _rayjob_budgets(rayjob: Mapping[str, Any]) -> list[Budget]:
    """``spec.backoffLimit`` against ``status.failed``: KubeRay retries a failed attempt
    while ``failed < backoffLimit + 1`` (``checkBackoffLimitAndUpdateStatusIfNeeded``)."""
    spec = mapping(rayjob.get("spec"))
    limit = _int(spec.get("backoffLimit"))
    failed = _int(mapping(rayjob.get("status")).get("failed"))
    name = f"RayJob {mapping(rayjob.get('metadata')).get('name')}"
    text = f"backoffLimit {limit}: " + _retries(failed, limit).replace("counted ", "", 1)
    return [Budget(name, "spec.backoffLimit", limit, failed, text)]


def _rayjob_decision(rayjob: Mapping[str, Any]) -> Decision | None:
    """Why a RayJob ended: its deployment status, reason (AppFailed, DeadlineExceeded,
    SubmissionFailed, ...) and message, as KubeRay writes them."""
    status = mapping(rayjob.get("status"))
    deployment = status.get("jobDeploymentStatus")
    if deployment not in ("Complete", "Failed"):
        return None
    return Decision(
        f"RayJob {mapping(rayjob.get('metadata')).get('name')}",
        str(deployment),
        str(status.get("reason") or status.get("jobStatus") or ""),
        str(status.get("message") or ""),
        status.get("endTime"),
    )


# --- budgets of a JobSet ----------------------------------------------------------------


def _jobset_budgets(jobset: Mapping[str, Any]) -> list[Budget]:
    spec = mapping(jobset.get("spec"))
    status = mapping(jobset.get("status"))
    policy = spec.get("failurePolicy")
    restarts = _int(status.get("restarts"))
    counted = status.get("restartsCountTowardsMax")
    counted = _int(counted) if counted is not None else restarts
    name = f"JobSet {mapping(jobset.get('metadata')).get('name')}"
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
    limit = _int(policy.get("maxRestarts"))
    text = f"maxRestarts {limit}: {_used(counted, limit, 'restart')}"
    if restarts != counted:
        text += f" ({restarts} in all; {restarts - counted} by rules that do not count)"
    return [Budget(name, "spec.failurePolicy.maxRestarts", limit, counted, text)]


def _used(used: int, limit: int, noun: str) -> str:
    left = max(0, limit - used)
    return f"{used} {noun}{'' if used == 1 else 's'} used, {left} left"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _jobset_decision(jobset: Mapping[str, Any]) -> Decision | None:
    name = f"JobSet {mapping(jobset.get('metadata')).get('name')}"
    return _final_condition(jobset, name, ("Completed",))


def _final_condition(obj: Mapping[str, Any], subject: str, done: Sequence[str]) -> Decision | None:
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


# --- one Job ----------------------------------------------------------------------------


def _next_group(job: Mapping[str, Any]) -> str:
    labels = mapping(mapping(job.get("metadata")).get("labels"))
    return str(labels.get(REPLICATED_JOB) or mapping(job.get("metadata")).get("uid"))


def _rules(job: Mapping[str, Any]) -> list[Any]:
    return items(mapping(mapping(job.get("spec")).get("podFailurePolicy")).get("rules"))


def _created(obj: Mapping[str, Any]) -> str:
    return str(mapping(obj.get("metadata")).get("creationTimestamp") or "")


def _job_story(
    job: Mapping[str, Any],
    tree: Tree,
    record: AppliedRecord,
    config: Config,
    source: _LiveAttempts,
    now: float,
    causes: _Causes | None = None,
) -> JobStory:
    meta = mapping(job.get("metadata"))
    spec = mapping(job.get("spec"))
    uid = str(meta.get("uid") or "")
    name = str(meta.get("name") or "")
    pods = tree.pods.get(uid)
    rules = _rules(job)
    own = causes is None  # a Job's own record, not its JobSet's
    causes = causes if causes is not None else _causes(job, f"Job {name}")
    attempts = []
    for pod in sorted(pods or (), key=_created):
        attempt = _attempt(pod, name, rules)
        _budget_facts(attempt, pod, rules, causes)
        attempts.append(attempt)
    counted_pods = sum(1 for a in attempts if a.counted)
    counted = max(job_failed_count(job), counted_pods)
    ignored = sum(1 for a in attempts if a.counted is False)
    story = JobStory(name, uid, job_state(job), counted, ignored, attempts=attempts)
    labels = mapping(meta.get("labels"))
    if labels.get(REPLICATED_JOB):
        index = labels.get(JOBSET_JOB_INDEX, "?")
        run = labels.get(RESTART_ATTEMPT, "0")
        rjob = labels[REPLICATED_JOB]
        story.role = f"replicatedJob {rjob}, job index {index}, run {run}"
    elif tree.kind.kind == "CronJob":
        story.role = f"created {_created(job)}"
    story.budgets = _job_budgets(job, attempts, counted, pods)
    running = story.state in ("Running", "Pending")
    if own:
        disruptions = _disruption_budgets(causes, running)
        story.budgets += disruptions
        story.next_disruption = _next_disruption(causes, disruptions) if running else []
    story.budgets += _in_place_budgets(attempts, name)
    if pods is None:
        story.notes.append("its pods could not be read: failed attempts are not shown")
    if story.state in ("Failed", "Succeeded", "Failing", "Succeeding"):
        story.decision = _job_decision(job, rules, record)
    elif pods is not None and has_policy_annotations(
        mapping(mapping(spec.get("template")).get("metadata"))
    ):
        story.next = _next_attempt(job, attempts, pods, config, source, now)
    return story


def _attempt(pod: Mapping[str, Any], job: str, rules: Sequence[Any]) -> Attempt:
    meta = mapping(pod.get("metadata"))
    spec = mapping(pod.get("spec"))
    status = mapping(pod.get("status"))
    phase = str(status.get("phase") or "Pending")
    annotations = mapping(meta.get("annotations"))
    raw_index = annotations.get(COMPLETION_INDEX)
    labels = mapping(meta.get("labels"))
    run = labels.get(RESTART_ATTEMPT)
    attempt = Attempt(
        pod=str(meta.get("name") or ""),
        job=job,
        phase=phase,
        node=spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else None,
        created=_created(pod),
        index=int(raw_index) if isinstance(raw_index, str) and raw_index.isdigit() else None,
        applied=dict(applied_record(pod).settings),
        run=int(run) if isinstance(run, str) and run.isdigit() else None,
    )
    if meta.get("deletionTimestamp") and phase not in ("Failed", "Succeeded"):
        attempt.phase = "Terminating"
    attempt.disruption = failures.disruption(pod)  # (also of a pod still stopping)
    if phase != "Failed":
        return attempt
    cause, when = failures.failure_cause(pod)
    attempt.cause = cause
    attempt.finished = _time(when)
    attempt.node_failed = failures.failed_node(pod) is not None
    what, _, rest = cause.partition(":")
    if what == "oom-killed":
        attempt.container, attempt.exit_code = rest, _exit_code(pod, rest)
    elif what == "exit-code":
        code, _, container = rest.partition(":")
        attempt.container, attempt.exit_code = container, int(code)
    match = failurepolicy.evaluate(rules, PodFailure.from_pod(pod))
    attempt.counted = failurepolicy.counts(match)
    if match is not None:
        attempt.rule, attempt.action = match.index, match.action
        if match.container is not None and attempt.container is None:
            attempt.container, attempt.exit_code = match.container.name, match.container.exit_code
    if attempt.disruption is not None and attempt.container is None:
        # What its first container stopped with (SIGTERM, or SIGKILL after the grace).
        exits = PodFailure.from_pod(pod).exits
        first = next((e for e in exits if e.exit_code != 0), None)
        if first is not None:
            attempt.container, attempt.exit_code = first.name, first.exit_code
    return attempt


def _exit_code(pod: Mapping[str, Any], container: str) -> int | None:
    for exit_ in PodFailure.from_pod(pod).exits:
        if exit_.name == container:
            return exit_.exit_code
    return None


def _time(when: float | None) -> str | None:
    if when is None:
        return None
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _job_budgets(
    job: Mapping[str, Any],
    attempts: Sequence[Attempt],
    counted: int,
    pods: Sequence[Mapping[str, Any]] | None,
) -> list[Budget]:
    spec = mapping(job.get("spec"))
    status = mapping(job.get("status"))
    name = f"Job {mapping(job.get('metadata')).get('name')}"
    limit = spec.get("backoffLimit")
    limit = limit if isinstance(limit, int) else None
    per_index = spec.get("backoffLimitPerIndex")
    on_failure = (
        mapping(mapping(spec.get("template")).get("spec")).get("restartPolicy") == "OnFailure"
    )
    if on_failure and limit is not None:
        restarts = _restarts(pods or ())
        text = (
            f"backoffLimit {limit}: {restarts} container restart(s) in running pods "
            "(restartPolicy OnFailure: the Job fails when they reach it)"
        )
        return [Budget(name, "spec.backoffLimit", limit, restarts, text)]
    if isinstance(per_index, int):
        budgets = []
        for index, used in sorted(_index_failures(attempts).items()):
            text = f"backoffLimitPerIndex {per_index}, index {index}: " + _retries(used, per_index)
            budgets.append(Budget(name, f"index {index}", per_index, used, text))
        failed = status.get("failedIndexes")
        most = spec.get("maxFailedIndexes")
        if isinstance(most, int):
            count = _index_count(failed if isinstance(failed, str) else "")
            budgets.append(
                Budget(
                    name,
                    "spec.maxFailedIndexes",
                    most,
                    count,
                    f"maxFailedIndexes {most}: {count} index(es) failed"
                    + (f" ({failed})" if failed else ""),
                )
            )
        return budgets
    if limit is None:
        return []
    return [
        Budget(
            name,
            "spec.backoffLimit",
            limit,
            counted,
            f"backoffLimit {limit}: " + _retries(counted, limit),
        )
    ]


def _retries(used: int, limit: int) -> str:
    failures_text = f"{used} counted failure{'' if used == 1 else 's'}"
    if used > limit:
        return f"{failures_text}: over the budget"
    left = limit - used
    return f"{failures_text}, {left} retr{'y' if left == 1 else 'ies'} left"


def _restarts(pods: Sequence[Mapping[str, Any]]) -> int:
    """Container restarts of running and pending pods, as ``pastBackoffLimitOnFailure``
    (pkg/controller/job/job_controller.go) sums them."""
    total = 0
    for pod in pods:
        status = mapping(pod.get("status"))
        if status.get("phase") not in ("Running", "Pending"):
            continue
        for group in ("initContainerStatuses", "containerStatuses"):
            for cs in items(status.get(group)):
                total += _int(mapping(cs).get("restartCount"))
    return total


def _index_failures(attempts: Sequence[Attempt]) -> dict[int, int]:
    """Counted failures per index: its failed pods that count (pods are kept after they
    fail, so this is what the controller's per-index count read from them says)."""
    found: dict[int, int] = {}
    for a in attempts:
        if a.index is not None:
            found[a.index] = found.get(a.index, 0) + (1 if a.counted else 0)
    return found


def _index_count(intervals: str) -> int:
    """How many indexes ``1,3-5`` names (``status.failedIndexes``)."""
    total = 0
    for part in filter(None, intervals.split(",")):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            total += int(last or first) - int(first) + 1
    return total


def _job_decision(
    job: Mapping[str, Any], rules: Sequence[Any], record: AppliedRecord
) -> Decision | None:
    name = f"Job {mapping(job.get('metadata')).get('name')}"
    decision = _final_condition(job, name, ("Complete",))
    if decision is None:
        for condition in items(mapping(job.get("status")).get("conditions")):
            condition = mapping(condition)
            if condition.get("status") == "True" and condition.get("type") in _ENDING:
                decision = Decision(
                    name,
                    str(condition["type"]),
                    str(condition.get("reason") or ""),
                    str(condition.get("message") or ""),
                    condition.get("lastTransitionTime"),
                )
                break
    if decision is None or decision.reason != "PodFailurePolicy":
        return decision
    found = parse_failjob_message(decision.message)
    if found is None:
        return decision
    decision.rule = found.index
    decision.action = found.action
    decision.pod = found.pod
    decision.container = found.container
    decision.exit_code = found.exit_code
    decision.pod_condition = found.condition
    rule = rules[decision.rule] if decision.rule < len(rules) else None
    own = record if record.settings else applied_record(job)
    key = ours(rule, own)
    decision.origin = (
        f"added by retry-policy for {key}" if key else ("your rule" if rule else "unknown rule")
    )
    decision.annotation = PREFIX + key if key else None
    return decision


# --- budgets per cause -------------------------------------------------------------------

#: What the webhook and its controller write in their conditions' messages (read back here;
#: the tests make them with the writers): ``DeletionMarker.mark``
#: (webhook/cluster/deletions.py), ``Disruptions.count`` and ``Disruptions.mark_peers``
#: (webhook/controller/disruptions.py).
_DISRUPTOR = re.compile(r"(?:forced )?deletion by (?P<user>.+?), a disruptor \(retry-policy")
_OVER = re.compile(r"disruption (?P<number>\d+)(?: of index \S+)?, over max-disruptions")
_PEER = re.compile(
    r"peer pod (?P<pod>\S+) was disrupted \((?P<cause>[^)]*)\); peer-disruptions (?P<how>\w+)"
)


@dataclass
class _Causes:
    """What the controller counts a workload's disruptions against
    (``webhook.controller.disruptions``): the workload's record (a Job's own; a JobSet's
    for all its Jobs' pods) and ``max-disruptions``, per index or not."""

    subject: str
    record: Record
    max_disruptions: int | None
    per_index: bool


def _causes(obj: Mapping[str, Any], subject: str) -> _Causes:
    """``obj``'s budget as its pods carry it: the template label the controller reads
    (``max-disruptions``), else the applied record's; per index as the controller scopes
    the pods the Job creates (``disruption_scope``: an Indexed Job's with
    ``backoffLimitPerIndex`` carry ``job-index-failure-count``)."""
    limit = None
    for spec in _job_specs(obj):
        template = mapping(spec.get("template"))
        limit = label_value(template, MAX_DISRUPTIONS_LABEL, parse_count)
        if limit is not None:
            break
    recorded = applied_record(obj).get("maxDisruptions")
    if limit is None and isinstance(recorded, int) and not isinstance(recorded, bool):
        limit = recorded
    per_index = False
    if obj.get("kind") == "Job":
        indexed = mapping(obj.get("spec")).get("completionMode") == "Indexed"
        per_index = disruption_scope(pod_from_template(obj, 0 if indexed else None)) is not None
    return _Causes(subject, Record.of(obj) or Record(), limit, per_index)


def _disruption_budgets(causes: _Causes, running: bool) -> list[Budget]:
    """Disruptions counted against ``max-disruptions``, as the controller counts them: the
    workload's (``Record.disruptions_of``), or each index's."""
    limit = causes.max_disruptions
    if limit is None:
        return []
    if not causes.per_index:
        return [_disruption_budget(causes, limit, causes.record.disruptions_of(), None, running)]
    counts = sorted(
        (int(key), used) for key, used in causes.record.disruptions.items() if key.isdigit()
    )
    if counts:
        return [_disruption_budget(causes, limit, used, i, running) for i, used in counts]
    text = f"max-disruptions {limit} per index: no disruption counted yet"
    return [
        Budget(
            causes.subject,
            PREFIX + "max-disruptions",
            limit,
            0,
            text,
            DisruptionBudget(0, 0, None, per_cause.disruption(1, limit) if running else None),
        )
    ]


def _disruption_budget(
    causes: _Causes, limit: int, used: int, index: int | None, running: bool
) -> Budget:
    free, counted = min(used, limit), max(0, used - limit)
    where = f", index {index}" if index is not None else ""
    text = f"max-disruptions {limit}{where}: {used} disruption{'' if used == 1 else 's'}"
    text += f" counted: {free} free, {counted} counted against the retry budget"
    if used < limit:
        text += f" ({limit - used} free left)"
    after = per_cause.disruption(used + 1, limit) if running else None
    return Budget(
        causes.subject,
        PREFIX + "max-disruptions",
        limit,
        used,
        text,
        DisruptionBudget(free, counted, index, after),
    )


def _next_disruption(causes: _Causes, budgets: Sequence[Budget]) -> list[str]:
    """What the next disruption does, as ``Disruptions.count`` decides it: free while the
    count is under ``max-disruptions``; from N + 1 on, its pod is marked and counted."""
    lines = []
    for budget in budgets:
        facts = budget.disruptions
        if facts is None or facts.next is None or budget.limit is None:
            continue
        number = budget.used + 1
        where = f"of index {facts.index}: " if facts.index is not None else ""
        if facts.index is None and causes.per_index:
            where = "of any index: "
        if facts.next == "free":
            lines.append(
                f"{where}free: disruption {number} of the {budget.limit} max-disruptions "
                "allows (the Ignore rule on DisruptionTarget takes its pod)"
            )
        else:
            lines.append(
                f"{where}counted: disruption {number}, over max-disruptions {budget.limit}: "
                f"the controller marks its pod {failurepolicy.DISRUPTION_BUDGET_EXHAUSTED} "
                "and it counts against the retry budget"
            )
    limit = causes.max_disruptions
    listed = [b for b in budgets if b.disruptions is not None and b.disruptions.index is not None]
    if lines and limit and listed:
        lines.append(f"of an index not listed: free (each index's first {limit} are)")
    return lines


def _in_place_budgets(attempts: Sequence[Attempt], job: str) -> list[Budget]:
    """Each pod still running against ``max-in-place-restarts`` (its own budget)."""
    budgets = []
    for a in attempts:
        facts = a.in_place
        if facts is None or facts.limit is None or a.phase not in ("Running", "Pending"):
            continue  # (a pod ended, or being deleted, restarts in place no more)
        if facts.replaced:
            continue  # (nor one replaced: its deadline ends it)
        text = f"max-in-place-restarts {facts.limit}, pod {a.pod}: {_in_place_used(facts)}"
        field_ = PREFIX + "max-in-place-restarts"
        budgets.append(Budget(f"Pod {a.pod}", field_, facts.limit, facts.restarts, text))
    return budgets


def _late(lowered: bool | None) -> str | None:
    return None if lowered is None else "lowered" if lowered else "other"


def _in_place_used(facts: InPlace) -> str:
    used = f"{facts.restarts} restart{'' if facts.restarts == 1 else 's'} in place"
    if facts.limit is None:
        return used
    if facts.replaced or per_cause.replaced(facts.restarts, facts.limit):
        return f"{used}: the budget is used, the controller replaces the pod"
    left = facts.limit - facts.restarts
    return f"{used}, {left} left before the controller replaces the pod"


def _budget_facts(
    attempt: Attempt, pod: Mapping[str, Any], rules: Sequence[Any], causes: _Causes
) -> None:
    """What the budgets per cause say of one pod: a disruptor's deletion the webhook
    marked, how the controller counted its disruption, its PeerDisrupted mark, and its
    restarts in place; each from the conditions, labels and record the webhook and its
    controller write."""
    meta = mapping(pod.get("metadata"))
    target = pod_condition(pod, failurepolicy.DISRUPTION_TARGET)
    if target is not None and target.get("reason") == DELETION_BY_DISRUPTOR:
        found = _DISRUPTOR.match(str(target.get("message") or ""))
        attempt.deleted_by = found.group("user") if found else "a disruptor"
    limit = label_value(pod, MAX_DISRUPTIONS_LABEL, parse_count)
    if target is not None and limit is not None:
        uid = meta.get("uid")
        seen = causes.record.disrupted(uid) if isinstance(uid, str) and uid else None
        exhausted = pod_condition(pod, failurepolicy.DISRUPTION_BUDGET_EXHAUSTED)
        over = _OVER.match(str(mapping(exhausted).get("message") or ""))
        attempt.disruption_count = DisruptionCount(
            {"free": "free", "over": "counted"}.get(seen or ""),
            limit,
            int(over.group("number")) if over else None,
            exhausted is not None,
            _late(causes.record.late_lowered(str(uid or ""))),
        )
    peer = pod_condition(pod, failurepolicy.PEER_DISRUPTED)
    if peer is not None:
        said = _PEER.match(str(peer.get("message") or ""))
        rule = mapping(rules[attempt.rule]) if attempt.rule is not None else {}
        on = {mapping(c).get("type") for c in items(rule.get("onPodConditions"))}
        attempt.peer = PeerMark(
            said.group("pod") if said else None,
            said.group("cause") if said else None,
            label_value(pod, PEERS_LABEL, str),
            failurepolicy.PEER_DISRUPTED in on,
        )
    budget = label_value(pod, MAX_RESTARTS_LABEL, parse_restart_budget)
    used = restarts(pod)
    replaced = pod_condition(pod, failurepolicy.IN_PLACE_BUDGET_EXHAUSTED) is not None
    spec = mapping(pod.get("spec"))
    in_place = any(items(c.get("restartPolicyRules")) for c in podspec.containers(spec))
    if budget is not None or replaced or (used and in_place):
        attempt.in_place = InPlace(used, budget, replaced)


# --- the next attempt -------------------------------------------------------------------


class _LiveAttempts:
    """The attempt source of the next attempt's admission: the Jobs and pods as read,
    counted as the webhook's attempt cache counts them, and its failure history recorded
    from the failed pods as its pod watch records them."""

    def __init__(self, tree: Tree, lookups: Lookups):
        self.lookups = lookups
        self.jobs = {
            str(mapping(j.get("metadata")).get("uid")): j
            for j in tree.jobs
            if mapping(j.get("metadata")).get("uid")
        }
        self.history = FailureHistory(lookups.core_api, JOB_UID_LABEL, self._counted)
        self.counted_pods: dict[str, int] = {}
        for uid, pods in tree.pods.items():
            for pod in pods:
                if mapping(pod.get("status")).get("phase") != "Failed":
                    continue
                counted = self._counted(uid, pod)
                self.counted_pods[uid] = self.counted_pods.get(uid, 0) + int(counted)
                self.history.record(pod, uid, counted)
        self.last: HistoryLookup | None = None

    def _counted(self, job_uid: str, pod: Mapping[str, Any]) -> bool:
        rules = _rules(self.jobs.get(job_uid) or {})
        return failurepolicy.counts(failurepolicy.evaluate(rules, PodFailure.from_pod(pod)))

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        job = self.jobs.get(uid)
        if job is None:
            return AttemptLookup(None, "none", f"Job {namespace}/{name} was not read")
        return AttemptLookup(
            max(job_failed_count(job), self.counted_pods.get(uid, 0)),
            "Job status (read now)",
            budget=placement_budget(job),
            terminating=terminating_pods(job),
        )

    def job_history(self, key: HistoryKey) -> HistoryLookup:
        answer = self.history.lookup(key)
        if answer is None:  # counted failures whose pods were not among those read
            answer = self.history.fetch(key)
        self.last = answer
        return answer

    def limit_ranges(self, namespace: str) -> LimitLookup:
        return self.lookups.limit_ranges(namespace)

    def placement(self, question: Placement) -> NodeAnswer:
        return self.lookups.placement(question)

    def stats(self) -> dict[str, Any]:
        return {}


def _next_attempt(
    job: Mapping[str, Any],
    attempts: Sequence[Attempt],
    pods: Sequence[Mapping[str, Any]],
    config: Config,
    source: _LiveAttempts,
    now: float,
) -> NextAttempt:
    meta = mapping(job.get("metadata"))
    spec = mapping(job.get("spec"))
    indexed = spec.get("completionMode") == "Indexed"
    index = None
    if indexed:
        failed = [a for a in attempts if a.phase == "Failed" and a.index is not None]
        index = failed[-1].index if failed else 0
    pod = pod_from_template(job, index, _index_failures(attempts).get(index or 0, 0))
    source.last = None
    reviewed = engine.review(pod, config, str(meta.get("namespace") or ""), attempts=source)
    result = reviewed.result
    record = applied_record(result)
    out = NextAttempt(
        job=str(meta.get("name")),
        attempt=record.get("attempt") + 1 if isinstance(record.get("attempt"), int) else None,
        attempts=record.get("attempts") if isinstance(record.get("attempts"), int) else None,
        non_spot=record.get("nonSpot") if isinstance(record.get("nonSpot"), bool) else None,
        changes=[
            w.removeprefix("retry-policy: ")
            for w in reviewed.verdict.warnings
            if w != engine.EXPLAIN_HINT
        ],
    )
    if mapping(mapping(pod.get("metadata")).get("labels")).get(RESTART_ATTEMPT):
        out.unit = "JobSet run"  # its pods place themselves by the set's runs
    if out.attempt is None:
        counted = source.job_failures("", "", str(meta.get("uid"))).failures
        out.attempt = counted + 1 if isinstance(counted, int) else None
    out.memory = _memory_changes(pod, result)
    avoided = record.get("avoidedNodes")
    if isinstance(avoided, int) and avoided > 0 and source.last is not None:
        out.avoided_nodes = list(source.last.nodes[-avoided:])
        out.avoided_by = "preference" if record.get("avoidedBy") == "preference" else "requirement"
    out.delay = delay_of(pods, now) or _planned_delay(result, now)
    return out


def _memory_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[MemoryChange]:
    changes = []
    old = {c.get("name"): c for c in podspec.containers(mapping(before.get("spec")))}
    for container in podspec.containers(mapping(after.get("spec"))):
        name = container.get("name")
        was = mapping(old.get(name))
        for kind in ("requests", "limits"):
            a = mapping(mapping(was.get("resources")).get(kind)).get("memory")
            b = mapping(mapping(container.get("resources")).get(kind)).get("memory")
            if a != b:
                changes.append(MemoryChange(str(name), kind[:-1], a, b))
    return changes


def delay_of(pods: Sequence[Mapping[str, Any]], now: float) -> Delay | None:
    """A pod of the Job held back by a retry delay: gated (``retry-policy.dev/retry-delay``)
    with the time it may start (``retry-policy.dev/not-before``), and what is left of it."""
    for pod in pods:
        spec = mapping(pod.get("spec"))
        gates = {mapping(g).get("name") for g in items(spec.get("schedulingGates"))}
        if RETRY_DELAY_GATE not in gates:
            continue
        delay = _delay(mapping(pod.get("metadata")), now)
        if delay is not None:
            delay.pod = str(mapping(pod.get("metadata")).get("name") or "") or None
            return delay
    return None


def _planned_delay(pod: Mapping[str, Any], now: float) -> Delay | None:
    """The delay the next pod's admission gives it (the webhook's retry delays write
    ``not-before`` on the pod): the hook by which ``status`` shows it once they do."""
    return _delay(mapping(pod.get("metadata")), now)


def _delay(meta: Mapping[str, Any], now: float) -> Delay | None:
    raw = mapping(meta.get("annotations")).get(NOT_BEFORE)
    if not isinstance(raw, str):
        return None
    try:
        when = dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return Delay(None, raw, max(0, int(when - now + 0.999)))


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
                time=_time(parsed) or str(when) if parsed else str(when),
                type=str(event.get("type") or ""),
                reason=str(event.get("reason") or ""),
                note=str(event.get("note") or ""),
                count=_int(count) or 1,
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
    "Story",
    "applied_record",
    "as_stored",
    "delay_of",
    "events_of",
    "job_state",
    "recorded_config",
    "tell",
    "without_ours",
]
