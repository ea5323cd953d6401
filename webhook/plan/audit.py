"""The ``retry-policy.dev/audit`` record and the ``retry-policy.dev/managed`` label.

Under ``rollout: audit`` (the cluster config's, or a namespace's ``namespaces.<ns>.rollout``)
a setting that would come only from the cluster's or the namespace's defaults is not
applied: admission writes, instead, what it would have been, so that the controller can
replay the workload's real failures against it when the workload ends
(``RetryPolicyAudit``), and ``status`` and ``explain`` can say what enforcement changes.

One writer (``AuditRecord.to_annotation``) and one parser (``AuditRecord.of``). The record
is compact JSON with sorted keys:

- ``settings``: the audited settings, by annotation name without the prefix
  (``{"retries": "3", "fail-non-retriable": "42"}``), as an annotation would say them;
- ``by``: where each came from, ``cluster`` or ``namespace``, or ``guardRails`` for a
  workload without annotations of its own, which audit spares the guard rails too;
- ``parts``: for each JobSpec the audited settings would have changed, by its place in the
  object (``spec``; a CronJob's ``spec.jobTemplate.spec``; a JobSet's
  ``spec.replicatedJobs[<name>].template.spec``): ``backoffLimit`` and
  ``backoffLimitPerIndex`` as they would have been, ``rules``, the whole
  ``podFailurePolicy.rules`` list in order (the workload's own rules too: the Job
  controller takes the first rule that matches, ``getMatchingPodFailurePolicyRule``), and
  ``template``, what of its pod template sets our controller and the kubelet to work (the
  labels of ``webhook.plan.causes``, the regular containers' ``restartPolicy`` and
  ``restartPolicyRules``, the pod's ``restartPolicy``: ``webhook.plan.marks``);
- ``failurePolicy``: a JobSet's ``spec.failurePolicy`` as the audited settings would have
  left it, when they change it (``fail-non-retriable`` adds a ``FailJobSet`` rule,
  ``backoff-limit`` writes ``maxRestarts``): the replay follows the runs by it;
- ``denied``: present only when enforcing would deny the workload, and why (an
  unannotated workload's own spec above a guard rail);
- ``v``: the format, ``VERSION``; ``rev``: what this format's writer kept (1, no ``rev``:
  no ``failurePolicy``, and parts without ``template``), which a reader of ``v`` 1 may
  ignore.

The label: ``enforce`` when admission applied any setting to the workload, ``audit`` when
only audited defaults touched it (``kubectl get jobs -A -l retry-policy.dev/managed=audit``
lists what enforcing would change).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.kube.objects import mapping
from webhook.policy.config import AUDITED as AUDITED
from webhook.policy.config import ENFORCE as ENFORCE
from webhook.policy.config import ROLLOUTS
from webhook.policy.model import PREFIX

AUDIT = PREFIX + "audit"
MANAGED = PREFIX + "managed"
#: The values of ``MANAGED`` are those of a ``rollout`` in the cluster config
#: (``webhook.policy.config``): ``ENFORCE``, ``AUDITED``.
#: The format this version writes, and its revision (see the module's doc).
VERSION = 1
REVISION = 2
#: Where an audited setting came from: a default, or a guard rail (a workload without
#: annotations of its own is audited under the rails too: ``kinds.audit``).
BY_CLUSTER, BY_NAMESPACE, BY_RAIL = "cluster", "namespace", "guardRails"


def by_words(by: str) -> str:
    """Where an audited setting came from, in words: "cluster default", "guardRails"."""
    return by if by == BY_RAIL else f"{by} default"


@dataclass(frozen=True)
class AuditedPart:
    """One JobSpec as the audited defaults would have left it."""

    path: str
    backoff_limit: int | None = None
    backoff_limit_per_index: int | None = None
    rules: tuple[Mapping[str, Any], ...] = ()
    #: The pod template's part that sets our controller to work (see the module's doc);
    #: ``None`` in a record of revision 1.
    template: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rules": [dict(r) for r in self.rules]}
        if self.backoff_limit is not None:
            out["backoffLimit"] = self.backoff_limit
        if self.backoff_limit_per_index is not None:
            out["backoffLimitPerIndex"] = self.backoff_limit_per_index
        if self.template is not None:
            out["template"] = dict(self.template)
        return out


@dataclass(frozen=True)
class AuditRecord:
    """What the defaults would have applied to one workload, had they been enforced."""

    settings: Mapping[str, str]
    by: Mapping[str, str] = field(default_factory=dict)
    parts: tuple[AuditedPart, ...] = ()
    #: A JobSet's failurePolicy under the audited settings, when they change it.
    failure_policy: Mapping[str, Any] | None = None
    revision: int = REVISION
    #: Why enforcing would deny the workload ("": it would not); then ``parts`` is empty.
    denied: str = ""

    def to_annotation(self) -> str:
        doc: dict[str, Any] = {
            "v": VERSION,
            "rev": self.revision,
            "settings": dict(self.settings),
            "by": dict(self.by),
            "parts": {p.path: p.to_json() for p in self.parts},
        }
        if self.failure_policy is not None:
            doc["failurePolicy"] = dict(self.failure_policy)
        if self.denied:
            doc["denied"] = self.denied
        return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode()

    def part(self, path: str) -> AuditedPart | None:
        return next((p for p in self.parts if p.path == path), None)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> AuditRecord | None:
        """The object's record, or None when it has none or one this version cannot read
        (a reader then says the audit is unknown rather than guess)."""
        text = mapping(mapping(obj.get("metadata")).get("annotations")).get(AUDIT)
        if not isinstance(text, str):
            return None
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(doc, dict) or doc.get("v") != VERSION:
            return None
        settings, by, parts = doc.get("settings"), doc.get("by"), doc.get("parts")
        if not isinstance(settings, dict) or not isinstance(by, dict):
            return None
        if not isinstance(parts, dict):
            return None
        read = []
        for path, part in parts.items():
            if not isinstance(part, dict) or not isinstance(part.get("rules", []), list):
                return None
            template = part.get("template")
            read.append(
                AuditedPart(
                    str(path),
                    _int(part.get("backoffLimit")),
                    _int(part.get("backoffLimitPerIndex")),
                    tuple(r for r in part.get("rules", []) if isinstance(r, dict)),
                    template if isinstance(template, dict) else None,
                )
            )
        failure_policy = doc.get("failurePolicy")
        revision = doc.get("rev", 1)
        denied = doc.get("denied", "")
        return cls(
            {str(k): str(v) for k, v in settings.items()},
            {str(k): str(v) for k, v in by.items()},
            tuple(read),
            failure_policy if isinstance(failure_policy, dict) else None,
            revision if isinstance(revision, int) and not isinstance(revision, bool) else 1,
            denied if isinstance(denied, str) else "",
        )


def managed(obj: Mapping[str, Any]) -> str | None:
    """The object's ``MANAGED`` label: ``enforce``, ``audit``, or None."""
    value = mapping(mapping(obj.get("metadata")).get("labels")).get(MANAGED)
    return value if value in ROLLOUTS else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
