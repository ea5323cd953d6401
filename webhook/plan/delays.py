"""Between attempts, at a pod's admission: which attempt it is (``attempt-env``) and when it
may start (``retry-delay``).

``attempt-env`` gives every container three env vars, so that the application can read
its attempt from its environment:

- ``RETRY_POLICY_ATTEMPT``: the failures counted before this pod (0 for the first), as its
  workload counts them: a Job's counted failures, an Indexed Job's index's, a JobSet's
  restarts (its pods' ``restart-attempt``), a bare Pod's ``retry-policy.dev/attempt``. The
  pods of a NonIndexed Job with ``parallelism`` above 1 share it: it is the Job's count
  when the pod was admitted, not a number of the pod's own (pods running side by side read
  the same, two replacements after one failure too);
- ``RETRY_POLICY_MAX_ATTEMPTS``: the attempts its budget allows, where that is known (a
  Job's ``backoffLimit`` + 1, an index's ``backoffLimitPerIndex`` + 1, a JobSet's
  ``maxRestarts`` + 1, a Pod's ``backoff-limit`` + 1; not an Indexed Job whose budget is
  shared by all its indexes);
- ``RETRY_POLICY_LAST_FAILURE``: why the previous attempt failed, ``oom-killed:<container>``,
  ``exit-code:<code>:<container>``, ``disruption``, or empty (the first attempt, or a cause
  that cannot be told) (``webhook.cluster.history.failure_cause``).

A variable the container already sets is never replaced (``env`` wins over ``envFrom``, so
one set through ``envFrom`` is; set it in ``env`` to keep yours).

``retry-delay`` holds the pod of attempt n >= 1 back for ``retry-delay x factor^(n-1)``
(at most ``retry-delay-max`` and ``guardRails.maxRetryDelay``), counted from the previous
attempt's failure: the webhook gives it the scheduling gate and ``not-before``
(``webhook.kube.gates``), and the controller removes the gate when the time comes. No gate
is added while no controller leads (it would never be removed), nor when the time has
passed already, nor (``ungateable``) on a pod the API server would refuse gated (one with
``spec.nodeName``) or on a follower of JobSet's exclusive placement whose wait would count
from its own admission (its leader's gate held it back already).

A gated pod has no node: deleted by anyone but its Job controller, it is deleted at once
and marked ``Failed`` by PodGC (``gcUnscheduledTerminating`` in pkg/controller/podgc), and
the Job controller counts it as a failed attempt (to let it go early, remove the gate).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.cluster.leadership import GateReleases, LeaderLive, Now, Passed
from webhook.kube import gates, jobsetplacement, podspec
from webhook.kube.owned import ALL, SHALLOW, Owned
from webhook.plan.outcome import Context, Outcome
from webhook.policy.grammar import format_duration, format_time
from webhook.policy.model import PREFIX, Policy, retry_delays
from webhook.problems import Problem

ATTEMPT = "RETRY_POLICY_ATTEMPT"
MAX_ATTEMPTS = "RETRY_POLICY_MAX_ATTEMPTS"
LAST_FAILURE = "RETRY_POLICY_LAST_FAILURE"
ENV_NAMES = (ATTEMPT, MAX_ATTEMPTS, LAST_FAILURE)

#: What a pod's retry delay writes besides the containers' env (``webhook.kube.owned``):
#: the gate list, the ``not-before`` annotation and the gated label (each replaced whole).
METADATA_OWNED: dict[str, Owned] = {"annotations": SHALLOW, "labels": SHALLOW}
SPEC_OWNED: dict[str, Owned] = {"schedulingGates": ALL}


@dataclass(frozen=True)
class Attempt:
    """Where a pod stands: the failures counted before it (``None``: unknown, ``reason``
    says why), the attempts its budget allows (``None``: unknown), the previous
    failure's cause and time (``history``: whether they could be told)."""

    failures: int | None
    source: str = ""
    reason: str = ""
    attempts: int | None = None
    last_cause: str = ""
    last_failed_at: float | None = None
    history: bool = False
    history_reason: str = ""
    #: Counted failures whose pods were not seen: ``failures`` may be low by that many.
    unseen: int = 0

    def label(self) -> str:
        """``attempt 3 of 5`` (1-based: the failures before it, plus one)."""
        n = (self.failures or 0) + 1
        return f"attempt {n} of {self.attempts}" if self.attempts else f"attempt {n}"


def wanted(policy: Policy) -> bool:
    return policy.attempt_env or policy.retry_delay is not None


def check(policy: Policy, ctx: Context, where: str) -> list[Problem]:
    """What makes these settings wrong whatever the pod: ``retry-delay-max`` below
    ``retry-delay``, and a delay above the guard rail ``guardRails.maxRetryDelay``."""
    problems: list[Problem] = []
    first, most = policy.retry_delay, policy.retry_delay_max
    if first is None:
        return problems
    if most is not None and most < first:
        problems.append(
            Problem(
                f"{where} {PREFIX}retry-delay-max",
                f"{format_duration(most)} is below retry-delay {format_duration(first)}; "
                f"accepted: a duration of at least {format_duration(first)}",
                "contradiction",
            )
        )
    rail = ctx.config.rails(ctx.namespace).max_retry_delay
    for name, value in (("retry-delay", first), ("retry-delay-max", most)):
        if rail is not None and value is not None and value > rail:
            problems.append(
                Problem(
                    f"{where} {PREFIX}{name}",
                    f"{format_duration(value)} is above this cluster's limit; accepted: a "
                    f"duration up to {format_duration(rail)} (guardRails.maxRetryDelay)",
                    "guard-rail",
                )
            )
    return problems


def pinned(spec: Mapping[str, Any]) -> str | None:
    """The node a pod spec names (``spec.nodeName``), if any. Such a pod is never gated:
    the API server refuses to create a pod that has both a node and scheduling gates
    (``ValidatePodCreate`` in pkg/apis/core/validation/validation.go: "nodeName: cannot be
    set until all schedulingGates have been cleared"), so a gated retry would never exist
    (``FailedCreate``, and the Job would wait for it forever)."""
    node = spec.get("nodeName")
    return node if isinstance(node, str) and node else None


def pinned_message(node: str, delay: int, where: str) -> str:
    """Why ``retry-delay`` cannot hold back the pods of a spec that names ``node``."""
    return (
        f"{format_duration(delay)} cannot hold back a pod that names its node: {where}.nodeName "
        f"is {node!r}, and the API server refuses a pod with both nodeName and a scheduling "
        "gate (nodeName: cannot be set until all schedulingGates have been cleared), so no "
        "delayed retry could be created; accepted: no retry-delay here, or node affinity (a "
        f"nodeSelector) on kubernetes.io/hostname in place of {where}.nodeName"
    )


def add_env(spec: dict[str, Any], attempt: Attempt, out: Outcome, setting: Any, bare: bool) -> None:
    """The attempt env vars in every container (init containers too) that does not set
    them already; unknown values are left out, with a warning (a bare Pod's previous
    failure is never known: its ``RETRY_POLICY_LAST_FAILURE`` is empty, as documented)."""
    values: dict[str, str] = {}
    if attempt.failures is not None:
        values[ATTEMPT] = str(attempt.failures)
    else:
        out.note(
            f"retry-policy: {ATTEMPT} not set: the attempt number is unknown ({attempt.reason})"
        )
    if attempt.attempts is not None:
        values[MAX_ATTEMPTS] = str(attempt.attempts)
    if attempt.failures == 0:
        values[LAST_FAILURE] = ""
    elif attempt.failures is not None:
        values[LAST_FAILURE] = attempt.last_cause
        if not attempt.history and not bare:
            out.note(
                f"retry-policy: {LAST_FAILURE} is empty: the previous failure is unknown "
                f"({attempt.history_reason})"
            )
    added: dict[str, list[str]] = {}
    kept: dict[str, list[str]] = {}
    for container, env in podspec.envs(spec):
        name = str(container.get("name", "?"))
        present = {e.get("name") for e in env if isinstance(e, dict)}
        new = [{"name": k, "value": v} for k, v in values.items() if k not in present]
        for key in values:
            (kept if key in present else added).setdefault(key, []).append(name)
        if new:
            container["env"] = [*env, *new]
    if not any(added.values()):
        return  # (a reinvocation, or every container sets them itself)
    shown = ", ".join(f"{k}={values[k] or '(empty)'}" for k in added)
    out.changed(f"retry-policy: {shown} (attempt-env)", setting)
    for key, names in kept.items():
        out.note(f"retry-policy: kept your own {key} in containers {', '.join(names)}")


def hold(
    pod: dict[str, Any],
    policy: Policy,
    attempt: Attempt,
    ctx: Context,
    out: Outcome,
    bare: bool,
) -> dict[str, Any] | None:
    """Gate the pod until its delay has passed; return what was done, for the applied
    record (``None``: not held)."""
    if policy.retry_delay is None or gates.gate_index(pod) is not None:
        return None  # no delay asked, or held already (a reinvocation)
    if attempt.failures is None:
        out.note(f"retry-policy: not delayed: the attempt number is unknown ({attempt.reason})")
        return None
    if attempt.failures == 0:
        return None
    why = ungateable(pod, attempt)
    if why:
        out.note(f"retry-policy: {attempt.label()} not held back for its retry-delay: {why}")
        return None
    rail = ctx.config.rails(ctx.namespace).max_retry_delay
    seconds = retry_delays(policy, rail).seconds(attempt.failures)
    wait = format_duration(seconds)
    if attempt.last_failed_at is not None:
        due = attempt.last_failed_at + seconds
        if ctx.clock.ask(Passed(due)):
            return None  # its delay is over: it may run at once
        counted = "after the failure"
    else:
        due = float(ctx.clock.ask(Now()) + seconds)
        why = "a bare Pod's is not known" if bare else f"unknown: {attempt.history_reason}"
        counted = f"from admission (previous failure: {why})"
    if not ctx.clock.ask(LeaderLive()):
        # A gate nobody removes would hold the pod forever: run it now, and say so where
        # the user looks (a Warning Event on the workload), not only to the Job controller.
        out.note(
            f"retry-policy: {attempt.label()} not held back for its {wait} retry-delay: "
            "no controller leads to end it"
        )
        out.decided(
            "RetryDelaySkipped",
            f"{attempt.label()}: not held back for its {wait} retry-delay: no controller "
            "of the webhook leads to end it; it runs at once",
        )
        return None
    problem = ctx.clock.ask(GateReleases())
    if problem:  # a leader whose releases fail would not end it either
        out.note(
            f"retry-policy: {attempt.label()} not held back for its {wait} retry-delay: the "
            f"controller is not releasing gates now ({problem})"
        )
        out.decided(
            "RetryDelaySkipped",
            f"{attempt.label()}: not held back for its {wait} retry-delay: the controller of "
            f"the webhook is not releasing gates now ({problem}); it runs at once",
        )
        return None
    stamp = format_time(due)
    if not gates.add_gate(pod, stamp):
        return None
    out.changed(
        f"retry-policy: {attempt.label()} waits {wait} {counted}: gated until {stamp}",
        policy.setting("retry-delay"),
    )
    out.decided("RetryDelayed", f"{attempt.label()}: waits {wait} until {stamp}")
    out.actions["retry_delayed"] = out.actions.get("retry_delayed", 0) + 1
    return {"retryDelaySeconds": seconds}


def ungateable(pod: Mapping[str, Any], attempt: Attempt) -> str:
    """Why this pod must not get our gate ("" when it may): it names its node (``pinned``),
    or it is a follower of a JobSet's exclusive placement whose delay would count from its
    own admission (``jobsetplacement``: JobSet admits a follower only once its leader is
    scheduled, so the leader's gate held it back already)."""
    spec = pod.get("spec")
    node = pinned(spec) if isinstance(spec, dict) else None
    if node is not None:
        return f"spec.nodeName is {node!r}, and the API server refuses a gated pod with a node"
    if attempt.last_failed_at is None and jobsetplacement.follower(pod):
        return (
            "its controller created this follower only once its leader was scheduled, past the "
            "leader's own delay (exclusive placement)"
        )
    return ""


def env_in(container: Mapping[str, Any]) -> dict[str, str]:
    """The attempt env vars a container has (for tests and ``explain``)."""
    env = container.get("env")
    entries = env if isinstance(env, list) else []
    return {
        e["name"]: e.get("value", "")
        for e in entries
        if isinstance(e, dict) and e.get("name") in ENV_NAMES
    }
