"""v1 Pod: error-propagation env vars (in a PyTorchJob's pods only), and non-spot placement
of the last attempts.

A pod learns its policy from its own annotations (copied there from its workload's
template at workload admission), so the only lookup is its attempt number. Pods made
by a controller are never denied for policy problems: the controller could not fix
them and the workload was already validated; they are admitted with a warning
(fail-open). Bare pods, written by a person, are denied like any workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from webhook.cluster import history
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.history import HistoryKey, HistoryLookup, Killed
from webhook.kinds import inplace as in_place_rules
from webhook.kube import limitrange, podspec, scheduling
from webhook.kube.jobcontroller import index_failure_count
from webhook.kube.objects import controller_of
from webhook.kube.owned import Owned
from webhook.kube.wellknown import (
    COMPLETION_INDEX,
    INDEX_FAILURE_COUNT,
    JOBSET_UID,
    KUBEFLOW_GROUP,
    RESTART_ATTEMPT,
)
from webhook.plan import delays, failureaware, inplace
from webhook.plan.model import non_spot as placement_rule
from webhook.plan.outcome import Context, Outcome
from webhook.plan.policies import has_policy_annotations, pod_policy
from webhook.plan.record import AppliedRecord
from webhook.policy.grammar import BadValue, parse_count
from webhook.policy.model import APPLIED, PREFIX, Policy, format_value
from webhook.problems import Problem


class PodMutator:
    group = ""
    kind = "Pod"
    #: Placement depends on a live attempt count; validation must not second-guess it.
    enforce_applied = False
    #: All this mutator writes (``webhook.kube.owned``): the copy it edits shares the rest.
    owns: Owned = {
        "metadata": {**podspec.METADATA_OWNED, **delays.METADATA_OWNED},
        "spec": {**podspec.POD_SPEC_OWNED, **delays.SPEC_OWNED},
    }
    remember = True
    reevaluate_on_update: tuple[tuple[str, ...], ...] = ()

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
            # The needs between the valid keys are said with them: one apply shows all.
            needs = Outcome()
            failureaware.lacks_limit(policy, needs)
            self._report(out, [*problems, *needs.problems], owner)
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
        record: dict[str, Any] | None = None
        if policy.in_place_exit_codes:
            record = self._in_place(spec, policy, owner, ctx, out)
        if policy.non_spot_attempts > 0:
            placed = self._place(pod, spec, policy, owner, ctx, out)
            if placed is not None:
                record = {**(record or {}), **placed}
        if policy.failure_aware:
            learned = self._learn(pod, spec, policy, owner, ctx, out)
            if learned:
                record = {**(record or {}), **learned}
        if delays.wanted(policy):
            held = self._between(pod, spec, policy, owner, ctx, out)
            if held:
                record = {**(record or {}), **held}
        if record is not None and not out.problems:
            previous = AppliedRecord.of(pod)
            AppliedRecord(record, out.origins(previous)).write(metadata, previous)
        return out

    def _in_place(
        self, spec: dict[str, Any], policy: Policy, owner: Any, ctx: Context, out: Outcome
    ) -> dict[str, Any] | None:
        """A bare Pod's own in-place restarts (``webhook.plan.inplace``). A controller's
        pods get them from the workload's template, where the whole policy is checked."""
        if owner is not None:
            problem = Problem(
                f"annotation {PREFIX}in-place-exit-codes",
                f"set it on the {owner.get('kind')} that makes this pod",
                "wrong-scope",
            )
            self._report(out, [problem], owner)
            return None
        bound = inplace.Bound(
            inplace.deadline_set(spec.get("activeDeadlineSeconds")), "spec.activeDeadlineSeconds"
        )
        # "": the pod spec is the Pod's own, at spec (a template's is at <where>.spec).
        policy, deadline = inplace.check(policy, spec, ctx, out, "", bound)
        if out.problems or not policy.in_place_exit_codes:
            return None
        if deadline is not None:
            in_place_rules.write_deadline(
                spec, "activeDeadlineSeconds", deadline, "spec.activeDeadlineSeconds", out
            )
        in_place_rules.apply(spec, policy, out, "")
        return {
            "inPlaceExitCodes": list(policy.in_place_exit_codes),
            "inPlaceScope": policy.in_place_scope,
        }

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
        problems = []
        if limit is None:
            problems.append(
                Problem(
                    f"annotation {PREFIX}non-spot-attempts",
                    f"needs {PREFIX}backoff-limit on the Pod to know which attempts are last",
                    "missing-backoff-limit",
                )
            )
        elif n > limit + 1:
            problems.append(
                Problem(
                    f"annotation {PREFIX}non-spot-attempts",
                    f"{n} is more than the {limit + 1} attempts (backoff-limit {limit} + 1); "
                    f"accepted: 0 to {limit + 1}",
                    "too-many-non-spot",
                )
            )
        if owner is None and policy.attempt is None:
            problems.append(needs_attempt("non-spot-attempts"))
        if problems or limit is None:
            self._report(out, problems, owner)
            return None
        attempts = limit + 1
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
        non_spot = placement_rule(failures, attempts - 1, n)
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
            out.decided(
                "RetryOnNonSpot",
                f"{attempt_words(lookup, policy)}: on non-spot nodes, as non-spot-attempts "
                f"{n} asks for the last {_attempts(n)}",
            )
        return record

    # --- between attempts (``webhook.plan.delays``) ------------------------------------------
    def _between(
        self,
        pod: dict[str, Any],
        spec: dict[str, Any],
        policy: Policy,
        owner: Mapping[str, Any] | None,
        ctx: Context,
        out: Outcome,
    ) -> dict[str, Any] | None:
        """The attempt env vars (``attempt-env``) and the retry-delay gate."""
        problems = delays.check(policy, ctx, "annotation")
        if owner is None and policy.attempt is None:
            for name in ("attempt-env", "retry-delay"):
                if policy.explicit(name) and policy.value(name) not in (False, None):
                    problems.append(needs_attempt(name))
        node = delays.pinned(spec)
        if owner is None and node is not None and policy.retry_delay is not None:
            # (A controller's pod is only never gated: ``delays.hold``.)
            message = delays.pinned_message(node, policy.retry_delay, "spec")
            problems.append(Problem(f"annotation {PREFIX}retry-delay", message, "node-name"))
        if problems:
            self._report(out, problems, owner)
            if owner is None or any(p.reason != "guard-rail" for p in problems):
                return None
        attempt = attempt_here(pod, policy, owner, ctx)
        if attempt.unseen:
            out.note(
                f"retry-policy: attempt number {attempt.failures} may be low: "
                f"{attempt.unseen} earlier failure(s) of this Job were not examined"
            )
        if policy.attempt_env:
            delays.add_env(spec, attempt, out, policy.setting("attempt-env"), owner is None)
        return delays.hold(pod, policy, attempt, ctx, out, owner is None)

    # --- failure-aware retries (``webhook.plan.failureaware``) -------------------------------
    def _learn(
        self,
        pod: dict[str, Any],
        spec: dict[str, Any],
        policy: Policy,
        owner: Mapping[str, Any] | None,
        ctx: Context,
        out: Outcome,
    ) -> dict[str, Any] | None:
        """Give this attempt more memory where earlier attempts were OOM-killed, and keep it
        off the nodes where they failed; return what was done, for the applied record."""
        checks = Outcome()
        checked = failureaware.check_memory(spec, policy, ctx, checks, "this pod")
        out.notes.extend(checks.notes)
        if owner is None:
            # Nothing keeps a bare Pod's earlier attempts: no history could ever be read.
            for name in failureaware.SETTINGS:
                if policy.asks(name):
                    checks.problems.append(
                        Problem(
                            f"annotation {PREFIX}{name}",
                            "a Pod no controller made has no earlier attempts on record (the "
                            "OOM kills and failed nodes of earlier attempts are kept for a "
                            "Job's pods); accepted: run the Pod from a Job, annotated as this "
                            "Pod is",
                            "no-history",
                        )
                    )
        if checks.problems:
            self._report(out, checks.problems, owner)  # a controller's pod: warnings
            if owner is None:
                return None
            checked = failureaware.off(checked, "oom-memory-factor")  # its problems all
        if not checked.failure_aware:
            return None
        lookup, terminating = failure_history(pod, owner, ctx)
        wanted = " and ".join(
            what
            for what, on in (
                ("memory raise", checked.oom_memory_factor is not None),
                ("node avoidance", checked.avoid_failed_nodes),
            )
            if on
        )
        if not lookup.known:
            out.note(
                f"retry-policy: failure history unknown ({lookup.reason}); "
                f"pod admitted without {wanted}"
            )
            return None
        record: dict[str, Any] = {}
        previous = _applied(pod.get("metadata"))
        attempt = _which_attempt(pod, checked, owner, ctx)
        if checked.oom_memory_factor is not None:
            record.update(self._raise(spec, checked, lookup, previous, ctx, out, attempt))
        if checked.avoid_failed_nodes:
            record.update(self._avoid(spec, checked, lookup, ctx, out, attempt))
        if lookup.missing:
            out.note(_unexamined(lookup.missing, terminating))
        metadata = pod.get("metadata") or {}
        if history.jobset_without_uid(metadata):
            out.note(
                f"retry-policy: no {JOBSET_UID} label (JobSet < v0.9.0): "
                "earlier runs unknown, this run's failures only"
            )
        elif lookup.earlier_runs_unseen:
            out.note(
                f"retry-policy: JobSet run {history.jobset_run(metadata) - 1} left no failed "
                "pod on record here; learned from this run's failures only"
            )
        return record

    def _raise(
        self,
        spec: dict[str, Any],
        policy: Policy,
        lookup: HistoryLookup,
        previous: Mapping[str, Any],
        ctx: Context,
        out: Outcome,
        attempt: str = "next attempt",
    ) -> dict[str, Any]:
        """Each OOM-killed container gets ``oom-memory-factor`` times the memory it was
        killed at (the most, when several of its pods were), at most ``oom-memory-limit``
        and what the namespace's LimitRanges allow (``webhook.kube.limitrange``), never
        less than it has. (Pod-level memory was refused by ``check_memory``.)"""
        factor, cap = policy.oom_memory_factor, policy.oom_memory_limit
        if factor is None or cap is None or not lookup.oom_kills:
            return {}
        raised = previous.get("memoryRaised")
        if isinstance(raised, dict):
            return {"memoryRaised": raised}  # done at this pod's first admission
        namespace = ctx.namespace or ""
        bounds = ctx.cluster.limit_ranges(namespace)
        if not bounds.known:
            out.note(
                f"retry-policy: memory not raised after OOM kills: the LimitRanges of "
                f"namespace {namespace} are unknown ({bounds.reason})"
            )
            return {}
        wanted: limitrange.Raise = {}
        killed: dict[int, Killed] = {}
        for position, container in enumerate(podspec.containers(spec)):
            name = container.get("name")
            entry = lookup.killed(name) if isinstance(name, str) else None
            if entry is None:
                continue
            target = podspec.memory_target(container, factor, cap, (entry.request, entry.limit))
            if all(a.value == b.value for a, b in target.values()):
                out.note(
                    f"retry-policy: container {name} was OOM-killed {_times(entry.kills)}; its "
                    f"memory is not raised (none set, or already at oom-memory-limit {cap})"
                )
                continue
            wanted[position], killed[position] = target, entry
        fitted = limitrange.fit(spec, wanted, bounds.limits)
        if fitted.refused:
            out.note(
                "retry-policy: memory not raised after OOM kills: a LimitRange of namespace "
                f"{namespace} would refuse the pod ({'; '.join(sorted(fitted.refused))})"
            )
            return {}
        done: dict[str, int] = {}
        setting = policy.setting("oom-memory-factor")
        shown = format_value("oom-memory-factor", factor)
        containers = list(podspec.containers(spec))
        for position, values in fitted.values.items():
            container, entry = containers[position], killed[position]
            changes = []
            moves: list[tuple[str, str, str]] = []
            for kind, after in values.items():
                before = podspec.set_memory(container, kind, after)
                if before is not None:
                    changes.append(f"{kind[:-1]} {before} -> {after}")
                    moves.append((kind[:-1], str(before), str(after)))
            if not changes:
                out.note(
                    f"retry-policy: container {entry.container} was OOM-killed "
                    f"{_times(entry.kills)}; its memory is not raised (held at what "
                    f"{fitted.held.get(position, 'oom-memory-limit')} allows)"
                )
                continue
            done[entry.container] = entry.kills
            why = fitted.held.get(position)
            if why is None and any(v.value == cap.value for v in values.values()):
                why = f"oom-memory-limit {cap}"
            out.changed(
                f"retry-policy: container {entry.container} was OOM-killed "
                f"{_times(entry.kills)} before{_killed_at(wanted[position], entry)}: memory "
                f"{', '.join(changes)} (x{shown}" + (f", at most {why})" if why else ")"),
                setting,
            )
            out.decided(
                "RetryMemoryIncreased",
                f"{attempt}: container {entry.container} {_moves(moves)} after "
                f"{entry.kills} OOM kill{'s' if entry.kills > 1 else ''}"
                + (f" (at most {why})" if why else ""),
            )
            out.actions["memory_raised"] = out.actions.get("memory_raised", 0) + 1
        return {"memoryRaised": done} if done else {}

    def _avoid(
        self,
        spec: dict[str, Any],
        policy: Policy,
        lookup: HistoryLookup,
        ctx: Context,
        out: Outcome,
        attempt: str = "next attempt",
    ) -> dict[str, Any]:
        """Keep the pod off the nodes where the latest attempts failed: required while a
        Ready node remains that its own placement allows (its node selector, required node
        affinity, the non-spot requirement above, taints and tolerations: the question
        ``webhook.kube.scheduling`` answers from the Node cache), so the scheduler cannot
        pick a failed node; else preferred, so it still avoids them when it can but the
        pod is never left Pending for want of a node until the Job's deadline."""
        most = ctx.config.rails(ctx.namespace).max_avoided_nodes
        nodes = list(lookup.nodes[-most:])
        if not nodes:
            return {}
        pinned = podspec.pinned_to(spec, nodes)
        if pinned is not None:
            out.note(
                f"retry-policy: earlier attempts failed on {_nodes(nodes)}, but the pod may "
                f"only run there ({pinned}); not avoided"
            )
            return {}
        answer = ctx.cluster.placement(scheduling.placement(spec, nodes))
        record: dict[str, Any] = {"avoidedNodes": len(nodes)}
        if answer.known and answer.fits:
            changed = podspec.avoid_nodes(spec, nodes)
            text = f"keeping off {len(nodes)} node(s) where earlier attempts failed"
        else:
            why = answer.reason if not answer.known else "no other Ready node fits the pod"
            changed = podspec.prefer_off_nodes(spec, nodes)
            text = (
                f"avoiding {len(nodes)} node(s) where earlier attempts failed by preference "
                f"only ({why})"
            )
            record["avoidedBy"] = "preference"
        if changed:
            out.changed(
                f"retry-policy: {text}: {_nodes(nodes)}", policy.setting("avoid-failed-nodes")
            )
            out.decided("RetryNodesAvoided", f"{attempt}: {text}: {_nodes(nodes, 100)}")
            out.actions["nodes_avoided"] = out.actions.get("nodes_avoided", 0) + len(nodes)
        return record


def _unexamined(missing: int, terminating: int) -> str:
    """The warning for counted failures whose failed pods were not seen: a pod still
    terminating is counted before it fails (``AttemptLookup.terminating``), the others'
    pods were deleted before the watch saw them fail."""
    still = min(missing, terminating)
    parts = [f"{still} pod(s) still terminating"] if still else []
    if missing - still:
        parts.append(f"{missing - still} pod(s) gone")
    return f"retry-policy: {missing} earlier failure(s) of this Job not examined: " + ", ".join(
        parts
    )


def _killed_at(target: Mapping[str, Any], entry: Killed) -> str:
    """`` at <memory>``: the limit the container was OOM-killed at (its request when it
    had no limit), as a quantity like its own; "" when unknown."""
    for kind, killed in (("limits", entry.limit), ("requests", entry.request)):
        if kind in target and killed is not None:
            before = target[kind][0]
            return f" at {before.with_value(Fraction(killed))}"
    return ""


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


# --- decisions, for an Event each (``Outcome.decided``) ---------------------------------------
# Notes name the attempt and say what changed, briefly and always in the same words for the
# same decision (no times, no pod names): the server writes each as an Event on the
# workload, and a repeat of the same note counts into one Event instead of another one.
# Retry delays decide ``RetryDelayed`` the same way, where the pod is held back.


def attempt_words(lookup: AttemptLookup, policy: Policy) -> str:
    """ "attempt 3 of 4" (the attempt this pod is, of the budget's attempts when known:
    the Job's live ``backoffLimit``, else the pod's ``backoff-limit``), "attempt 3", or
    "next attempt" when its number is unknown."""
    if lookup.failures is None:
        return "next attempt"
    number = lookup.failures + 1
    limit = lookup.budget if lookup.budget is not None else policy.backoff_limit
    if limit is None or number > limit + 1:
        return f"attempt {number}"
    return f"attempt {number} of {limit + 1}"


def _which_attempt(
    pod: Mapping[str, Any], policy: Policy, owner: Mapping[str, Any] | None, ctx: Context
) -> str:
    """``attempt_words`` for a pod that learns from earlier attempts, with its index when
    its history is its index's (an Indexed Job's pods)."""
    words = attempt_words(attempt_of(pod, policy, owner, ctx), policy)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    index = annotations.get(COMPLETION_INDEX) if isinstance(annotations, dict) else None
    return f"index {index}, {words}" if isinstance(index, str) and index.isdigit() else words


def _attempts(n: int) -> str:
    return "attempt" if n == 1 else f"{n} attempts"


def _moves(moves: list[tuple[str, str, str]]) -> str:
    """ "1Gi -> 1536Mi" when request and limit moved alike, else each named."""
    if len({(before, after) for _, before, after in moves}) == 1:
        return f"{moves[0][1]} -> {moves[0][2]}"
    return ", ".join(f"{kind} {before} -> {after}" for kind, before, after in moves)


def _nodes(nodes: list[str], budget: int = 120) -> str:
    """Node names for a warning (a warning is cut past 250 characters): as many as fit,
    the first always (shortened when it alone is too long)."""
    shown: list[str] = []
    for index, name in enumerate(nodes):
        if len(name) > budget // 2:
            name = name[: budget // 2 - 3] + "..."
        if shown and sum(len(n) + 2 for n in shown) + len(name) > budget:
            return ", ".join(shown) + f" and {len(nodes) - index} more"
        shown.append(name)
    return ", ".join(shown)


def _applied(metadata: Any) -> dict[str, Any]:
    """What this webhook recorded on the pod before (a reinvocation sees it)."""
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    raw = annotations.get(APPLIED) if isinstance(annotations, dict) else None
    record = AppliedRecord.parse(raw)
    return dict(record.settings) if record is not None else {}


def failure_history(
    pod: Mapping[str, Any], owner: Mapping[str, Any] | None, ctx: Context
) -> tuple[HistoryLookup, int]:
    """What earlier attempts of this pod's Job (its index, for an Indexed Job; its
    replicated Job and job index across restarts, for a JobSet) went through, and how
    many of the Job's pods are still terminating. The history must be complete up to
    the failures the Job controller counted: those of the index
    (``job-index-failure-count``, with a per-index budget), else the Job's."""
    if owner is None or owner.get("kind") != "Job" or not owner.get("uid"):
        return history.unknown("the pod has no owning Job"), 0
    metadata = pod.get("metadata") or {}
    namespace = namespace_of(metadata, ctx)
    name, uid = str(owner.get("name")), str(owner["uid"])
    lineage, index = history.pod_lineage(metadata, uid)
    annotations = metadata.get("annotations") or {}
    expected = index_failure_count(annotations)
    per_index = expected is not None and index is not None
    terminating = 0
    if not per_index:
        counted = ctx.cluster.job_failures(namespace, name, uid)
        if counted.failures is None:
            return history.unknown(counted.reason), 0
        expected, terminating = counted.failures, counted.terminating
    place = history.jobset_place(metadata)
    key = HistoryKey(
        namespace,
        name,
        uid,
        lineage,
        index,
        expected,
        per_index,
        jobset=place[0] if place else None,
        run=history.jobset_run(metadata) if place else 0,
    )
    return ctx.cluster.job_history(key), terminating


def _pytorchjob_pod(owner: Mapping[str, Any] | None) -> bool:
    """Whether the training operator made this pod for a PyTorchJob (``error-propagation``
    applies there only: ``podspec.NOT_A_PYTORCHJOB``)."""
    if owner is None or owner.get("kind") != "PyTorchJob":
        return False
    return str(owner.get("apiVersion") or "").startswith(f"{KUBEFLOW_GROUP}/")


def namespace_of(metadata: Mapping[str, Any], ctx: Context) -> str:
    """The pod's namespace: the request's (the API server's word), else the object's when
    it is a string (a mistyped one is refused by the API server anyway)."""
    written = metadata.get("namespace")
    return ctx.namespace or (written if isinstance(written, str) else "")


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
    index_failures = index_failure_count(annotations)
    if index_failures is not None:
        return AttemptLookup(index_failures, f"annotation {INDEX_FAILURE_COUNT}")
    if owner is not None and owner.get("kind") == "Job" and owner.get("uid"):
        namespace = namespace_of(metadata, ctx)
        return ctx.cluster.job_failures(namespace, str(owner.get("name")), str(owner["uid"]))
    return AttemptLookup(None, "none", f"no {PREFIX}attempt annotation and no owning Job")


def attempt_here(
    pod: Mapping[str, Any], policy: Policy, owner: Mapping[str, Any] | None, ctx: Context
) -> delays.Attempt:
    """Which attempt a pod is, of how many, and what the previous one failed of, when:
    its failures from ``attempt_of``, but for an Indexed Job whose budget the indexes
    share, the failures of its own index (the failure history counts them); its budget
    from its Job's live ``backoffLimit``, else its ``backoff-limit`` annotation (an index's
    ``backoffLimitPerIndex``, a JobSet's ``maxRestarts``, a Pod's own); the previous failure
    from the failure history (a JobSet's: the set's latest, which restarted it)."""
    lookup = attempt_of(pod, policy, owner, ctx)
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    shared_index = (
        policy.attempt is None
        and RESTART_ATTEMPT not in labels
        and RESTART_ATTEMPT not in annotations
        and INDEX_FAILURE_COUNT not in annotations
        and COMPLETION_INDEX in annotations
    )
    failures = lookup.failures
    budget = policy.backoff_limit
    if lookup.budget is not None and not shared_index:
        budget = lookup.budget
    elif shared_index:
        budget = None  # the Job's budget is the indexes' together: none of an index alone
    attempts = budget + 1 if budget is not None else None
    needs_history = shared_index or (failures or 0) > 0
    if not needs_history or owner is None:
        reason = "a bare Pod's failures are not recorded" if owner is None else ""
        return delays.Attempt(
            failures, lookup.source, lookup.reason, attempts, history_reason=reason
        )
    found, _ = failure_history(pod, owner, ctx)
    if shared_index:
        if not found.known:
            return delays.Attempt(None, "none", found.reason, attempts, history_reason=found.reason)
        failures = found.index_failures
        if failures == 0:
            return delays.Attempt(0, "failure history", "", attempts, history=True)
    return delays.Attempt(
        failures,
        lookup.source if not shared_index else "failure history",
        lookup.reason,
        attempts,
        found.last_cause if found.known else "",
        found.last_failed_at if found.known else None,
        found.known,
        found.reason,
        found.missing if shared_index else 0,
    )


def needs_attempt(name: str) -> Problem:
    """A bare Pod's ``name`` needs its attempt number, which only its author can give."""
    return Problem(
        f"annotation {PREFIX}{name}",
        f"a Pod no controller made needs {PREFIX}attempt, its attempt number (failures so "
        "far), as nothing else counts its attempts; accepted: that annotation, or the Pod "
        "run from a Job",
        "missing-attempt",
    )
