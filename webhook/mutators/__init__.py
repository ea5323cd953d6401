"""Workload mutators: one module per kind, one registry.

A mutator edits a deep copy of the admitted object in place and reports, as values,
what it changed (each change becomes a warning) and what is wrong (each problem
becomes part of a denial). The engine diffs the copy against the original for the
patch, and derives validation from the same run, so the two webhooks cannot disagree.
Adding a kind means one new module and one ``register`` call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

# What mutators share; imported from here by every kind.
from webhook.kube.objects import controller_of, items, mapping
from webhook.plan.outcome import Change, Context, Decision, Outcome
from webhook.plan.policies import (
    affected_unannotated,
    default_layers,
    has_policy_annotations,
    pod_policy,
    policy_keys,
    workload_policy,
)

__all__ = [
    "Change",
    "Context",
    "Decision",
    "Mutator",
    "Outcome",
    "affected_unannotated",
    "controller_of",
    "default_layers",
    "has_policy_annotations",
    "items",
    "lookup",
    "mapping",
    "pod_policy",
    "policy_keys",
    "register",
    "registered",
    "workload_policy",
]


class Mutator(Protocol):
    group: str
    kind: str
    #: Whether the validating webhook denies annotation-requested changes it finds missing.
    enforce_applied: bool

    def applies(self, obj: Mapping[str, Any], ctx: Context) -> bool:
        """Cheap test run before any copy: can this object be changed or denied at all?"""
        ...

    def mutate(self, obj: dict[str, Any], ctx: Context) -> Outcome: ...


_REGISTRY: dict[tuple[str, str], Mutator] = {}


def register(cls: type) -> type:
    """Class decorator: one instance of each mutator serves every request (they are stateless)."""
    mutator = cls()
    _REGISTRY[(mutator.group, mutator.kind)] = mutator
    return cls


def lookup(group: str, kind: str) -> Mutator | None:
    return _REGISTRY.get((group, kind))


def registered() -> list[tuple[str, str]]:
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    # Imported for their ``register`` side effect; kept last to avoid import cycles.
    from webhook.mutators import (  # noqa: F401
        cronjob,
        job,
        jobset,
        pod,
        pytorchjob,
        rayjob,
        trainjob,
    )


_load_builtin()
