"""v1 Pod: error-propagation env vars (in a PyTorchJob's pods only), and non-spot placement
of the last attempts.

A pod learns its policy from its own annotations (copied there from its workload's
template at workload admission), so the only lookup is its attempt number. Pods made
by a controller are never denied for policy problems: the controller could not fix
them and the workload was already validated; they are admitted with a warning
(fail-open). Bare pods, written by a person, are denied like any workload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from webhook import podspec
from webhook.attempts import AttemptLookup
from webhook.mutators import (
    Context,
    Outcome,
    controller_of,
    has_policy_annotations,
    pod_policy,
    register,
)
from webhook.owned import Owned
from webhook.policy import (
    APPLIED,
    PREFIX,
    BadValue,
    Policy,
    parse_count,
)
from webhook.problems import Problem

INDEX_FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
#: Set by JobSet on its child Jobs and their pods: the JobSet's ``status.restarts``.
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"


class PodMutator:
    group = ""
    kind = "Pod"
    #: Placement depends on a live attempt count; validation must not second-guess it.
    enforce_applied = False
    #: All this mutator writes (``webhook.owned``): the copy it edits shares the rest.
    owns: Owned = {"metadata": podspec.METADATA_OWNED, "spec": podspec.POD_SPEC_OWNED}

    def applies(self, pod: Mapping[str, Any], ctx: Context) -> bool:
        return has_policy_annotations(pod.get("metadata"))

    def mutate(self, pod: dict[str, Any], ctx: Context) -> Outcome:
        out = Outcome()
        metadata: Any = pod.get("metadata")  # a mapping with our annotations: ``applies``
        if not self.applies(pod, ctx):
            return out
        owner = controller_of(metadata)
        policy, problems = pod_policy(metadata.get("annotations"))
        if problems:
            self._report(out, problems, owner)
            return out
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            return out
        out.policies["spec"] = policy
        if policy.error_propagation and not _pytorchjob_pod(owner):
            self._report(
                out,
                [
                    Problem(
                        f"annotation {PREFIX}error-propagation",
                        "cannot apply to a Pod that no PyTorchJob owns: "
                        + podspec.NOT_A_PYTORCHJOB,
                        "not-applicable",
                    )
                ],
                owner,
            )
        elif policy.error_propagation:
            names = podspec.add_error_propagation(spec, policy.error_propagation)
            if names:
                out.changed(
                    "retry-policy: error-propagation env vars added to containers "
                    + ", ".join(names),
                    policy.setting("error-propagation"),
                )
        if policy.non_spot_attempts > 0:
            record = self._place(pod, spec, policy, owner, ctx, out)
            if record is not None and not out.problems:
                text = json.dumps(record, sort_keys=True, separators=(",", ":"))
                podspec.set_annotation(metadata, APPLIED, text)
        return out

    def _report(self, out: Outcome, problems: list[Problem], owner: Any) -> None:
        if owner is None:
            out.problems.extend(problems)
        else:
            for problem in problems:
                out.note(f"retry-policy: not applied to this pod: {problem}")

    def _place(
        self,
        pod: dict[str, Any],
        spec: dict[str, Any],
        policy: Policy,
        owner: Mapping[str, Any] | None,
        ctx: Context,
        out: Outcome,
    ) -> dict[str, Any] | None:
        limit = policy.backoff_limit
        n = policy.non_spot_attempts
        if limit is None:
            self._report(
                out,
                [
                    Problem(
                        f"annotation {PREFIX}non-spot-attempts",
                        f"needs {PREFIX}backoff-limit on the Pod to know which attempts are last",
                        "missing-backoff-limit",
                    )
                ],
                owner,
            )
            return None
        attempts = limit + 1
        if n > attempts:
            self._report(
                out,
                [
                    Problem(
                        f"annotation {PREFIX}non-spot-attempts",
                        f"{n} is more than the {attempts} attempts (backoff-limit {limit} + 1); "
                        f"accepted: 0 to {attempts}",
                        "too-many-non-spot",
                    )
                ],
                owner,
            )
            return None
        lookup = attempt_of(pod, policy, owner, ctx)
        if lookup.failures is None:
            out.note(
                f"retry-policy: attempt number unknown ({lookup.reason}); "
                "pod admitted without non-spot placement"
            )
            return None
        failures = lookup.failures
        if lookup.budget is not None:
            # The Job's backoffLimit now: it may have been changed since the template's
            # backoff-limit was written, and the last attempts are the last of the budget
            # the Job controller enforces (``exceedsBackoffLimit`` reads the live spec).
            attempts = lookup.budget + 1
        non_spot = failures >= attempts - n
        record = {"attempt": failures, "attempts": attempts, "nonSpot": non_spot}
        if not non_spot:
            return record
        spot = ctx.config.spot_node_labels
        pinned = podspec.requires_spot(spec, spot)
        if pinned:
            self._report(
                out,
                [
                    Problem(
                        f"annotation {PREFIX}non-spot-attempts",
                        f"the pod requires spot nodes ({pinned}); cannot place it elsewhere",
                        "contradiction",
                    )
                ],
                owner,
            )
            return None
        if podspec.add_non_spot_affinity(spec, spot):
            out.changed(
                f"retry-policy: attempt {failures + 1} of {attempts} ({failures} failures so far, "
                f"from {lookup.source}) must run on non-spot nodes",
                policy.setting("non-spot-attempts"),
            )
        return record


register(PodMutator)  # a call, not a decorator: mypyc compiles decorated classes apart


def _pytorchjob_pod(owner: Mapping[str, Any] | None) -> bool:
    """Whether the training operator made this pod for a PyTorchJob (``error-propagation``
    applies there only: ``podspec.NOT_A_PYTORCHJOB``)."""
    if owner is None or owner.get("kind") != "PyTorchJob":
        return False
    return str(owner.get("apiVersion") or "").startswith("kubeflow.org/")


def attempt_of(
    pod: Mapping[str, Any], policy: Policy, owner: Mapping[str, Any] | None, ctx: Context
) -> AttemptLookup:
    """A pod's attempt number, from the most direct source available, in this order:

    1. ``retry-policy.dev/attempt``: an orchestrator that knows says so.
    2. ``jobset.sigs.k8s.io/restart-attempt`` (label, else annotation): a JobSet's pod counts
       whole runs of the set, which is what its copied ``backoff-limit`` (= maxRestarts)
       counts too. It must win over the two below: the pod is also owned by a child Job
       and may carry an index failure count, but those count failures inside one run and
       restart from 0 with every new child Job. The label counts every restart, including
       those that do not consume maxRestarts, so it can only run ahead of the budget:
       placement may start early, never late.
    3. ``batch.kubernetes.io/job-index-failure-count``: Indexed Jobs with a per-index budget.
    4. The owning Job's counted failures, from the attempt cache.
    """
    if policy.attempt is not None:
        return AttemptLookup(policy.attempt, f"annotation {PREFIX}attempt")
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    for kind, source in (("label", labels), ("annotation", annotations)):
        raw = source.get(RESTART_ATTEMPT) if isinstance(source, dict) else None
        if raw is None:
            continue
        try:
            return AttemptLookup(parse_count(str(raw)), f"{kind} {RESTART_ATTEMPT}")
        except BadValue:
            return AttemptLookup(None, "none", f"{kind} {RESTART_ATTEMPT} is not a number")
    raw = annotations.get(INDEX_FAILURE_COUNT)
    if isinstance(raw, str):
        try:
            return AttemptLookup(parse_count(raw), f"annotation {INDEX_FAILURE_COUNT}")
        except BadValue:
            pass
    if owner is not None and owner.get("kind") == "Job" and owner.get("uid"):
        namespace = metadata.get("namespace") or ctx.namespace or ""
        return ctx.attempts.job_failures(namespace, str(owner.get("name")), str(owner["uid"]))
    return AttemptLookup(None, "none", f"no {PREFIX}attempt annotation and no owning Job")
