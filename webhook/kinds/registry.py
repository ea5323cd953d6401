"""The one list of kinds (``KINDS``), and what is looked up in it: a kind's mutator, its
view, its API defaulting, its resource name, the names users type, its explainer and
simulator (``explain``), and its story facts (``status``).

Adding a kind is one folder (``kinds/<kind>/``: ``mutate.py``, ``explain.py``, a
``simulate.py`` when its controller counts its own way, a ``story.py`` when ``status``
tells it, and ``SPEC`` in its
``__init__``) and one line here; the chart's kind list is held to this one by
``tests/kinds/test_registry.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.cluster.events import WorkloadKind, Workloads
from webhook.kinds import cronjob, job, jobset, pod, pytorchjob, rayjob, trainjob
from webhook.kinds.base import KindSpec, Mutator, View
from webhook.policy.config import Config

KINDS: tuple[KindSpec, ...] = (
    job.SPEC,
    cronjob.SPEC,
    jobset.SPEC,
    trainjob.SPEC,
    rayjob.SPEC,
    pytorchjob.SPEC,
    pod.SPEC,
)

#: How Events find each kind's objects from what they made (``KindSpec.workload``), for
#: the Event recorder's resolver and the controller (built once; read off the admission).
WORKLOADS = Workloads(
    WorkloadKind(spec.group, spec.version, spec.kind, spec.plural, spec.workload)
    for spec in KINDS
    if spec.workload is not None
)

#: Each kind by (group, version, kind), as a review names it: a kind is handled at the
#: version its controller serves, and another version is not that kind (``batch/v2``).
_BY_GVK = {(spec.group, spec.version, spec.kind): spec for spec in KINDS}
_BY_KIND = {(spec.group, spec.kind): spec for spec in KINDS}
#: The mutator of each kind, by (group, version, kind): one instance serves every request
#: (they are stateless).
MUTATORS: dict[tuple[str, str, str], Mutator] = {key: s.mutator for key, s in _BY_GVK.items()}
#: The view of each kind that has one (``kinds.view``), by (group, version, kind).
VIEWS: dict[tuple[str, str, str], View] = {
    key: s.view for key, s in _BY_GVK.items() if s.view is not None
}


def spec_for(group: str, version: str, kind: str) -> KindSpec | None:
    return _BY_GVK.get((group, version, kind))


def kind_of(obj: Mapping[str, Any]) -> KindSpec | None:
    """The kind of an object by its ``apiVersion`` and ``kind`` (``None``: not handled)."""
    group, _, version = str(obj.get("apiVersion") or "").rpartition("/")
    return _BY_GVK.get((group, version, str(obj.get("kind") or "")))


def known_kind(group: str, kind: str) -> KindSpec | None:
    """The kind of this group and name at whatever version: for saying which version is
    handled when another was given."""
    return _BY_KIND.get((group, kind))


def lookup(group: str, version: str, kind: str) -> Mutator | None:
    """The mutator of a kind (``None``: not one the webhook manages)."""
    return MUTATORS.get((group, version, kind))


def registered() -> list[tuple[str, str]]:
    return sorted((group, kind) for group, _, kind in MUTATORS)


def handled() -> str:
    """The kinds the webhook handles, for a message: "Job batch/v1, CronJob batch/v1, ..."."""
    return ", ".join(f"{spec.kind} {spec.api_version}" for spec in KINDS)


def view_of(
    group: str, version: str, kind: str, obj: Mapping[str, Any], config: Config | None = None
) -> dict[str, Any] | None:
    """The view of ``obj`` its kind's mutator runs on under ``config`` (``kinds.view``);
    ``None``: run on the whole object."""
    make = VIEWS.get((group, version, kind))
    return make(obj, config) if make is not None else None


def apply_defaults(obj: dict[str, Any]) -> None:
    """What the API server fills in before admission, for the offline commands: the
    kind's defaulting (``kube.defaulting``); kinds without any are left as written."""
    spec = kind_of(obj)
    if spec is not None and spec.defaulter is not None:
        spec.defaulter(obj)
