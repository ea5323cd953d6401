"""What a kind is made of: its mutator (``Mutator``) and its entry in the registry
(``KindSpec``, listed in ``kinds.registry.KINDS``), which names its explainer, its
simulator and its story facts too (``Named``: not imported on the admission path).

A mutator edits a deep copy of the admitted object in place and reports, as values,
what it changed (each change becomes a warning) and what is wrong (each problem
becomes part of a denial). The engine diffs the copy against the original for the
patch, and derives validation from the same run, so the two webhooks cannot disagree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast, runtime_checkable

from webhook.cluster.events import Workload
from webhook.kube.owned import Owned
from webhook.plan.explained import Explainer
from webhook.plan.model import LimitField
from webhook.plan.outcome import Context, Outcome
from webhook.plan.simulation import Simulator
from webhook.policy.config import Config
from webhook.problems import Problem

if TYPE_CHECKING:  # (not imported on the admission path: ``Named``)
    from webhook.kinds.services import PeerWriterType, WholeAuditType
    from webhook.kinds.story import StoryFacts

#: (record path, field path) of each JobSpec of a workload: ``spec``, a CronJob's
#: ``spec.jobTemplate.spec``, a JobSet's ``spec.replicatedJobs[<name>].template.spec``.
JobSpecs = list[tuple[str, tuple[str | int, ...]]]

#: What ``check_update`` finds: problems, warnings, and the settings the object has now.
UpdateCheck = tuple[list[Problem], list[str], set[str]]


class Mutator(Protocol):
    """What the engine calls on every kind's mutator. The optional capabilities are the
    Protocols below (``Restores``, ``ChecksUpdates``), each checked by type."""

    group: str
    kind: str
    #: Whether the validating webhook denies annotation-requested changes it finds missing.
    enforce_applied: bool
    #: What ``mutate`` may write (``webhook.kube.owned``); ``ALL``: anything, a full copy.
    owns: Owned
    #: Whether a verdict may be remembered per object shape (``admission.memo``): not when
    #: it depends on other objects (a TrainJob's on its runtime).
    remember: bool
    #: On UPDATE, the fields (paths) whose change makes the policy run again, besides our
    #: annotations (a CronJob's jobTemplate); empty: an UPDATE is only checked.
    reevaluate_on_update: tuple[tuple[str, ...], ...]

    def applies(self, obj: Mapping[str, Any], ctx: Context) -> bool:
        """Cheap test run before any copy: can this object be changed or denied at all?"""
        ...

    def mutate(self, obj: dict[str, Any], ctx: Context) -> Outcome: ...


@runtime_checkable
class Restores(Protocol):
    """A mutator that, on UPDATE, puts back what an earlier admission wrote and another
    writer dropped (a JobSet's rules its controller's apply resets, a TrainJob's runtime
    patch a ``kubectl apply`` replaced): the settings it restored, said as warnings."""

    def restore(self, obj: dict[str, Any], old: Mapping[str, Any], ctx: Context) -> list[str]: ...


@runtime_checkable
class FindsJobSpecs(Protocol):
    """A mutator of a kind made of batch/v1 JobSpecs, which says where they are."""

    def job_specs(self, obj: Mapping[str, Any]) -> JobSpecs: ...


@runtime_checkable
class ChecksUpdates(Protocol):
    """A mutator that checks an UPDATE against the object before it (``UpdateCheck``)."""

    def check_update(self, obj: Mapping[str, Any], old: Mapping[str, Any]) -> UpdateCheck: ...


#: What the policy reads of an object (``kinds.view``); ``None``: run on the whole object.
View = Callable[[Mapping[str, Any], "Config | None"], "dict[str, Any] | None"]


T = TypeVar("T")


@dataclass(frozen=True)
class Named(Generic[T]):
    """What a kind names but admission never runs (its explainer, its simulator, its story
    facts for ``status``): a module and a name in it, imported when first asked for, so
    that the admission path does not load them (``tests/kinds/test_registry.py`` holds it
    to that)."""

    module: str
    name: str

    def load(self) -> T:
        return cast(T, vars(importlib.import_module(self.module))[self.name])


#: What makes a kind's simulator: of one part's plan, or of the pods a kind's explainer
#: reads (``kinds/<kind>/simulate.py``); each is a ``plan.simulation.Simulator``.
SimulatorType = Callable[..., Simulator]


@dataclass(frozen=True)
class KindSpec:
    """One kind the webhook manages: where it is served, the names users type, its retry
    budget's field, its mutator, and what the rest of the webhook needs of it."""

    group: str
    version: str
    kind: str
    plural: str
    #: What a user types for it (``status job/NAME``): singular, plural, short names and
    #: the names qualified by group, as ``kubectl get`` takes them.
    names: tuple[str, ...]
    mutator: Mutator
    #: Where ``backoff-limit`` goes (``None``: no field of its own; a TrainJob's is its
    #: JobSet's). A Job's is ``backoffLimitPerIndex`` instead when that is set.
    budget_field: LimitField | None = None
    #: The API server's defaulting the offline commands apply first (``kube.defaulting``;
    #: ``None``: a custom resource whose schema defaults change no result).
    defaulter: Callable[[dict[str, Any]], None] | None = None
    view: View | None = None
    #: What ``status`` tells its story with (``kinds/<kind>/story.py``: how its Jobs are
    #: found, its own state, budgets and decision); ``None``: ``status`` does not tell it.
    story: Named[StoryFacts] | None = None
    #: What says its retry plan in words (``kinds/<kind>/explain.py``; ``webhook.explain``
    #: looks it up here); ``None``: ``explain`` does not cover it.
    explainer: Named[Explainer] | None = None
    #: Whose counting ``--simulate`` walks its failures through (``kinds/<kind>/simulate.py``,
    #: or the Job controller's, ``kinds/job/simulate.py``, for a kind whose controller
    #: counts as a Job's does); ``None``: its explanation simulates another kind's (a
    #: TrainJob's, its JobSet's).
    simulator: Named[SimulatorType] | None = None
    #: What stops a disrupted pod's peers with one write, for the controller
    #: (``webhook.kinds.services.PeerWriter``); ``None``: its peers are marked one by one.
    peers: Named[PeerWriterType] | None = None
    #: What audits it and its child Jobs as a whole once it ends, for the controller
    #: (``webhook.kinds.services.WholeAudit``); ``None``: each Job is audited on its own.
    whole_audit: Named[WholeAuditType] | None = None
    #: How Events find its objects from what they made (its Jobs, their pods), and what
    #: stands for them (``webhook.cluster.events.Workload``); ``None``: nothing of that.
    workload: Workload | None = None

    def job_specs(self, obj: Mapping[str, Any]) -> JobSpecs:
        """Where ``obj``'s JobSpecs are (none: a kind without its own): the one answer,
        its mutator's, for admission, the audit and ``status``."""
        return self.mutator.job_specs(obj) if isinstance(self.mutator, FindsJobSpecs) else []

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def chart_key(self) -> str:
        """Its switch in the chart's values (``webhook.kinds``): "jobs", "cronJobs",
        "pyTorchJobs"; a leading acronym is lowercased whole ("MPIJob": "mpiJobs")."""
        return chart_key(self.kind)


def chart_key(kind: str) -> str:
    """``kind`` in lower camel case, plural: its leading capitals lowercased, but the last
    of a run of them when it starts the next word ("MPIJob": "mpiJobs")."""
    run = len(kind) - len(kind.lstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    if 1 < run < len(kind) and kind[run].islower():
        run -= 1
    return kind[:run].lower() + kind[run:] + "s"
