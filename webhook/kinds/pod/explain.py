"""The Pod explainer (v1): a Pod is not retried by Kubernetes; its own policy, where it
runs, and its restarts in place (simulated by ``kinds.pod.simulate``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kinds import inplacewords, planner
from webhook.kinds.explaining import between_keys, in_place_keys
from webhook.kinds.pod.simulate import PodSimulator
from webhook.kube import restartrules
from webhook.kube.jobcontroller import index_failure_count
from webhook.kube.objects import mapping
from webhook.kube.wellknown import INDEX_FAILURE_COUNT
from webhook.plan.explained import POD_KEYS, Explanation, Subject
from webhook.plan.model import non_spot
from webhook.plan.words import attempt_table, setting_lines
from webhook.policy.grammar import format_duration
from webhook.policy.model import PREFIX, Policy


def explain_pod(subject: Subject) -> list[Explanation]:
    """A Pod is not retried by Kubernetes: explain its own policy and where it runs."""
    item = subject.header()
    metadata = mapping(subject.final.get("metadata"))
    annotations = mapping(metadata.get("annotations"))
    policy = subject.policy("spec") or planner.template_pod_policy(annotations)
    item.settings = setting_lines(policy, POD_KEYS + in_place_keys(policy) + between_keys(policy))
    limit, n = policy.backoff_limit, policy.non_spot_attempts
    attempt, source = _pod_attempt(policy, annotations)
    item.budget = (
        "Kubernetes does not retry a Pod: whoever creates the next attempt (a Job, an "
        "orchestrator) decides. This pod places itself by its attempt number"
        + (f" ({attempt}, from {source})." if attempt is not None else f" ({source}).")
    )
    if limit is not None and n > 0:
        item.attempts = attempt_table(
            f"annotation {PREFIX}backoff-limit", limit, limit, n, "no retry left"
        )
        if attempt is not None:
            where = "non-spot nodes only" if non_spot(attempt, limit, n) else "any node"
            item.notes.append(f"this pod is attempt {attempt + 1}: it runs on {where}")
    delays = planner.pod_delays(policy, subject.ctx)
    if delays is not None and attempt is not None:
        wait = delays.seconds(attempt)
        item.notes.append(
            f"retry-delay: this pod is attempt {attempt + 1}: "
            + (
                f"it is held back for {format_duration(wait)} from its admission (a bare "
                "Pod's previous failure is not known), while a controller leads"
                if wait
                else "the first attempt is not held back"
            )
        )
    _pod_in_place(item, subject)
    return [item]


def _pod_in_place(item: Explanation, subject: Subject) -> None:
    """A bare Pod's restarts in place: its containers' exit codes, and ``--simulate``."""
    pod_spec = subject.spec
    version = subject.ctx.kubernetes_version
    item.notes.extend(planner.dropped_note(pod_spec, version))
    restarts = restartrules.pod_restarts(pod_spec, subject.original.get("spec"), version)
    if restarts is None:
        return
    bound = planner.bound_of(
        planner.deadline_of(pod_spec, subject.original.get("spec"), "spec"),
        None,
        subject.ctx.config.rails(subject.ctx.namespace),
        owner="Pod",
    )
    simulator = PodSimulator(planner.container_names(pod_spec), restarts, bound)
    item.in_place = inplacewords.table(restarts, simulator.judge_exit, bound)
    item.simulator = simulator


def _pod_attempt(policy: Policy, annotations: Mapping[str, Any]) -> tuple[int | None, str]:
    if policy.attempt is not None:
        return policy.attempt, f"annotation {PREFIX}attempt"
    index_failures = index_failure_count(annotations)
    if index_failures is not None:
        return index_failures, f"annotation {INDEX_FAILURE_COUNT}"
    return None, "unknown offline: at admission it comes from the owning Job's failure count"
