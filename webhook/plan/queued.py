"""``retry-delay`` on a workload queued by Kueue (the label ``kueue.x-k8s.io/queue-name``).

While a retry is held back by our scheduling gate the workload is short of a ready pod, so
Kueue sees it ``PodsReady=False``; with ``waitForPodsReady`` on (by default from Kueue
v0.19), past its timeout Kueue evicts the whole Job or JobSet and queues it again
(``webhook.policy.kueue`` says which timeout and why). So at admission:

- the config does not state Kueue's timeouts (``kueue.waitForPodsReady``): a warning
  naming ``waitForPodsReady``, the delay unchecked;
- it states them, and the longest wait the budget allows fits within the timeout less
  ``kueue.startupAllowance``: a warning saying so;
- it does not fit: ``kueue.retryDelay: cap`` (the default) caps the delays there
  (``retry-delay`` and ``retry-delay-max``, written on the pod template like the rest of
  the policy), with a warning saying the cap and why; ``deny`` denies an annotation
  that asks for more, naming it, its value and what would be accepted (an admin default
  is capped instead: a default never makes a valid object fail);
- ``enable: false``: nothing (Kueue evicts nobody for it).

Where the label lies: a Job's, a JobSet's own labels; a CronJob's Jobs' (its
``jobTemplate.metadata.labels``: the Jobs it makes are what Kueue queues). A TrainJob's
is checked on the TrainJob (``trainjob``), and a bare Pod is not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kube.objects import mapping
from webhook.kube.wellknown import QUEUE_LABEL
from webhook.plan.outcome import Context, Outcome
from webhook.policy.grammar import format_duration
from webhook.policy.model import (
    PREFIX,
    Policy,
    Setting,
    Source,
    format_value,
    retry_delays,
    with_setting,
)
from webhook.problems import Problem

#: More retries than any budget allows: the longest wait when the budget is not known.
_UNBOUNDED = 10**9


def queue_of(obj: Mapping[str, Any], path: tuple[str | int, ...]) -> str | None:
    """The LocalQueue the Jobs made from the JobSpec at ``path`` of ``obj`` are queued in
    (``QueueNameForObject`` in pkg/controller/jobframework/utils.go reads the label)."""
    if path[:2] == ("spec", "jobTemplate"):
        template = mapping(mapping(obj.get("spec")).get("jobTemplate"))
        labels = mapping(mapping(template.get("metadata")).get("labels"))
    else:
        labels = mapping(mapping(obj.get("metadata")).get("labels"))
    value = labels.get(QUEUE_LABEL)
    return value if isinstance(value, str) and value else None


def check(
    policy: Policy,
    queue: str | None,
    ctx: Context,
    out: Outcome,
    retries: int | None,
    uncapped: str = "",
) -> Policy:
    """The Kueue check of one JobSpec's ``retry-delay`` (see the module); ``retries``: the
    most retries its budget allows (``None``: not known); ``uncapped``: why a delay too
    long is not capped here, in the kind's words (empty: it is). Returns the policy,
    capped where the config says so."""
    kueue = ctx.config.kueue
    if queue is None or policy.retry_delay is None or not kueue.enabled:
        return policy
    if retries is not None and retries < 1:
        return policy  # no retry to hold back
    rail = ctx.config.rails(ctx.namespace).max_retry_delay
    longest = retry_delays(policy, rail).seconds(_UNBOUNDED if retries is None else retries)
    head = f"retry-policy: queued by Kueue ({QUEUE_LABEL}: {queue}): "
    if not kueue.stated:
        _say(
            out,
            head + f"while a retry waits (up to {format_duration(longest)}, retry-delay) the "
            "workload is PodsReady=False, and Kueue's waitForPodsReady evicts and requeues "
            "it whole past its timeout (30m by default) or recoveryTimeout; state them in the "
            "webhook's config (kueue.waitForPodsReady) to have retry-delay checked",
        )
        return policy
    limit = kueue.longest_wait()
    _, bound = kueue.bound()
    allowance = format_duration(kueue.startup_allowance)
    if longest <= limit:
        _say(
            out,
            head + f"a retry waits at most {format_duration(longest)} (retry-delay), within "
            f"Kueue's waitForPodsReady {bound} less {allowance} to start "
            "(kueue.startupAllowance)",
        )
        return policy
    why = (
        f"past Kueue's waitForPodsReady {bound} a workload whose retry is held back "
        f"(PodsReady=False) is evicted and requeued whole, and a released pod needs "
        f"{allowance} to start (kueue.startupAllowance)"
    )
    blame = _blame(policy, limit)
    if kueue.retry_delay == "deny" and policy.setting(blame).source is Source.ANNOTATION:
        out.problems.append(_too_long(policy, blame, longest, limit, queue, why))
        return policy
    if uncapped:
        _say(
            out,
            head + f"a retry may wait {format_duration(longest)} (retry-delay): {why}; set "
            f"retry-delay-max {format_duration(limit)} or less (not capped here: {uncapped})",
        )
        return policy
    setting = Setting(limit, Source.CLUSTER, "(kueue.waitForPodsReady)")
    text = (
        f"retry-policy: retry-delay capped at {format_duration(limit)} (a retry would wait "
        f"{format_duration(longest)}), as queued by Kueue ({QUEUE_LABEL}: {queue}): {why}"
    )
    if all(change.text != text for change in out.changes):
        out.changed(text, setting)
    return cap(policy, setting)


def _say(out: Outcome, text: str) -> None:
    """A warning once per workload (a JobSet's replicated Jobs are checked one by one)."""
    if text not in out.notes:
        out.note(text)


def cap(policy: Policy, setting: Setting) -> Policy:
    """``policy`` with no retry waiting longer than ``setting``'s seconds:
    ``retry-delay-max`` (and ``retry-delay``, when above it) lowered to it."""
    limit = setting.value
    most = policy.retry_delay_max
    if most is None or most > limit:
        policy = with_setting(policy, "retry-delay-max", setting)
    if (policy.retry_delay or 0) > limit:
        policy = with_setting(policy, "retry-delay", setting)
    return policy


def _blame(policy: Policy, limit: int) -> str:
    """The setting that makes a retry wait past ``limit``: a first delay above it, else
    the growth (``retry-delay-max`` when set, else ``retry-delay-factor``)."""
    if (policy.retry_delay or 0) > limit:
        return "retry-delay"
    return "retry-delay-max" if policy.retry_delay_max is not None else "retry-delay-factor"


def _too_long(policy: Policy, name: str, longest: int, limit: int, queue: str, why: str) -> Problem:
    value = format_value(name, policy.value(name))
    shown = format_duration(limit)
    if name == "retry-delay":
        what, accepted = f"{value} is", f"a retry-delay up to {shown}"
    else:
        what = f"{value} lets a retry wait {format_duration(longest)}, which is"
        accepted = f"retry-delay-max {shown} or less, so that no retry waits longer"
    return Problem(
        f"annotation {PREFIX}{name}",
        f"{what} too long for a workload queued by Kueue ({QUEUE_LABEL}: {queue}): {why}; "
        f"accepted: {accepted}",
        "kueue",
    )
