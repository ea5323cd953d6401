"""What a policy run works in and reports: the context it may consult besides the object
(``Context``), and its outcome (``Outcome``): problems, changes, notes and decisions, as
values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.facts import ClusterFacts, NoCluster
from webhook.cluster.leadership import Clock
from webhook.cluster.runtimes import NoRuntimes, RuntimeSource
from webhook.kube.versions import KubeVersion
from webhook.plan.audit import AuditRecord
from webhook.plan.record import AppliedRecord, rule_id
from webhook.policy.config import Config
from webhook.policy.model import (
    BUILTIN,
    PREFIX,
    Policy,
    Setting,
    Source,
    with_setting,
)
from webhook.problems import Problem


@dataclass
class Context:
    """What a mutator may consult besides the object: config, the cluster's facts (a Job's
    counted failures, failure history, LimitRanges, Nodes: ``ClusterFacts``) and the
    Kubeflow Trainer runtimes (a TrainJob's JobSet is made from one)."""

    config: Config
    cluster: ClusterFacts = field(default_factory=NoCluster)
    namespace: str | None = None
    operation: str = "CREATE"
    runtimes: RuntimeSource = field(default_factory=NoRuntimes)
    #: The cluster's version (the config's pin, else the API server's): what decides
    #: whether feature-gated fields may be written (``plan.inplace``).
    kubernetes_version: KubeVersion | None = None
    #: A deadline outside the object that ends its in-place restarts, named: a TrainJob's,
    #: for the JobSet its controller makes (``kinds.trainjob`` checks it there).
    outer_bound: str | None = None
    #: Leadership and time, as a pod's retry-delay gate asks them
    #: (``webhook.cluster.leadership.Clock``; the engine records the answers).
    clock: Any = field(default_factory=Clock)

    def __post_init__(self) -> None:
        # Callers without a cluster may pass None for either source.
        if self.cluster is None:
            self.cluster = NoCluster()
        if self.runtimes is None:
            self.runtimes = NoRuntimes()


@dataclass(frozen=True)
class Change:
    """One change made to the object, with the setting that caused it."""

    text: str
    setting: Setting | None = None


@dataclass(frozen=True)
class Decision:
    """A decision that shapes a new pod of a workload, for the user: it becomes one Event
    regarding the workload (``webhook.cluster.events``; ``reason`` is one of its
    ``REASONS``), with a plain ``note`` naming the attempt."""

    reason: str
    note: str


@dataclass(frozen=True)
class PlannedPart:
    """What admission decided for one JobSpec part, recorded where it wrote the part: its
    location (keys and list indexes) and the policy it was written with. The planner
    (``kinds.planner.part_plan``) makes its ``plan.model.PartPlan`` from it over the
    object as stored: the rest of a plan is read from the whole object, which the
    mutator, running on a view (``kinds.view``), does not see, and admission never
    reads a plan, so the admission path pays one small record per part."""

    path: tuple[str | int, ...]
    policy: Policy


@dataclass
class Outcome:
    problems: list[Problem] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The notes of admin defaults skipped as they conflict with the spec (``conflict``),
    #: also in ``notes``: an audited admission says them of the defaults it holds back.
    skipped: list[str] = field(default_factory=list)
    #: The policy each spec was mutated with, after the spec was consulted (backoff limit
    #: resolved, settings a conflict skipped turned off), keyed by the spec's field path
    #: ("spec", "spec.jobTemplate.spec"). Not used by admission: ``explain`` reads it so
    #: that it shows the policy the webhook applied, not a second resolution of its own.
    policies: dict[str, Policy] = field(default_factory=dict)
    #: Each JobSpec part admission wrote, by its field path as ``policies``.
    plans: dict[str, PlannedPart] = field(default_factory=dict)
    #: What failure-aware retries did, for metrics and the decision log: containers whose
    #: memory was raised (``memory_raised``), nodes avoided (``nodes_avoided``).
    actions: dict[str, int] = field(default_factory=dict)
    #: What a user should read on the workload (an Event each), in the order decided.
    decisions: list[Decision] = field(default_factory=list)
    #: The webhook's rules in the object: each with the annotation that wants it, and
    #: whether this run wrote it (else it was there already).
    rules: list[tuple[Mapping[str, Any], str, bool]] = field(default_factory=list)
    #: Under ``rollout: audit``: what the defaults held back would have done
    #: (``kinds.audit``), as written in ``retry-policy.dev/audit``; ``explain`` shows it.
    audited: AuditRecord | None = None

    def wrote(self, rule: Mapping[str, Any], name: str, added: bool = True) -> None:
        """Rule ``rule`` of annotation ``name`` is in the object: ``added`` by this run,
        or there already (an earlier admission's, or the user's own)."""
        self.rules.append((rule, name, added))

    def origins(self, previous: AppliedRecord | None) -> dict[str, str]:
        """The rules the webhook wrote, by id (``record.rule_id``), for the applied record:
        those this run added, and those there already that ``previous`` (the object's
        record) says an earlier admission wrote; never a rule of the user's that equals
        one of ours."""
        known = previous.origins if previous is not None else {}
        found: dict[str, str] = {}
        for rule, name, added in self.rules:
            rid = rule_id(rule)
            if added or known.get(rid) == name:
                found[rid] = name
        return found

    def wrote_part(self, part: PlannedPart, where: str) -> None:
        """The JobSpec part ``part`` records (at ``where``, dotted) was written."""
        self.policies[where] = part.policy
        self.plans[where] = part

    def decided(self, reason: str, note: str) -> None:
        self.decisions.append(Decision(reason, note))

    def changed(self, text: str, setting: Setting | None = None) -> None:
        self.changes.append(Change(text, setting))

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def warnings(self) -> list[str]:
        return [c.text for c in self.changes] + self.notes

    def conflict(self, policy: Policy, name: str, message: str, reason: str) -> None:
        """A setting that cannot be honoured: deny it when the user asked for it by
        annotation; skip it with a warning when it came from an admin default (a
        default must never make an otherwise valid object fail)."""
        setting = policy.setting(name)
        if setting.source is Source.ANNOTATION:
            self.problems.append(Problem(f"annotation {PREFIX}{name}", message, reason))
        else:
            text = f"retry-policy: {name} ({setting.describe(name)}) skipped: {message}"
            self.note(text)
            self.skipped.append(text)

    def refuse(self, policy: Policy, name: str, message: str, reason: str) -> Policy:
        """``conflict``, and the policy the checks go on with. A setting you annotated is
        denied and stays on, so that its other, independent checks still run and one
        denial says every problem it has (a check whose problem makes a later one
        meaningless stops that one itself, and says so); a default is skipped: turned off
        (its ``BUILTIN`` value, keeping where it came from) and said once."""
        self.conflict(policy, name, message, reason)
        setting = policy.setting(name)
        if setting.source is Source.ANNOTATION:
            return policy
        return with_setting(policy, name, Setting(BUILTIN[name], setting.source))
