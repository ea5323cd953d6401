"""Failure-aware retries: more memory after an OOM kill, another node after a failure.

Two settings make a pod depend on how the earlier attempts of its Job ended
(``webhook.cluster.history`` keeps that): ``oom-memory-factor`` (with ``oom-memory-limit``)
gives each container the OOM killer stopped the factor times the memory it was stopped
at, at most the limit and what the namespace's LimitRanges allow; ``avoid-failed-nodes``
keeps the pod off the nodes where earlier attempts failed (the most recent few). Both act
on the new pod at its admission (``kinds.pod``); a workload's admission checks that
they can work (``check_template``) and copies them onto its pod template.

An OOM kill is exit code 137 (the kernel's SIGKILL), and a podFailurePolicy cannot tell it
from another SIGKILL: a rule that fails the Job on 137 would end it before a retry could
get more memory. A rule of yours that does so is a contradiction (denied when the factor
was annotated); ``fail-non-retriable`` gets 137 added to its retriable codes when they
came from a default, and is a contradiction when you wrote them without 137.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from webhook.kube import failurepolicy as fp
from webhook.kube import podspec, quantity
from webhook.kube.owned import deep_copy
from webhook.plan.outcome import Context, Outcome
from webhook.policy.model import PREFIX, Policy, Setting, Source, format_value, with_setting
from webhook.problems import Problem

SIGKILL = 137
#: Settings that read the failure history, and the value that turns each off.
SETTINGS = {"oom-memory-factor": None, "avoid-failed-nodes": False}


def off(policy: Policy, name: str) -> Policy:
    """``policy`` without one failure-aware setting (it keeps its source for messages)."""
    return with_setting(policy, name, Setting(SETTINGS[name], policy.setting(name).source))


def request_of(container: Mapping[str, Any]) -> quantity.Quantity | None:
    """A container's memory request as its pods get it: a pod whose container sets a
    limit and no request gets the limit as request (``SetDefaults_Pod``), a pod template
    does not."""
    return podspec.memory_of(container, "requests") or podspec.memory_of(container, "limits")


def named(pod_spec: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for container in podspec.containers(pod_spec):
        name = container.get("name")
        if isinstance(name, str):
            yield name, container


def lacks_limit(
    policy: Policy,
    out: Outcome,
    pod_spec: Mapping[str, Any] | None = None,
    ctx: Context | None = None,
) -> bool:
    """``oom-memory-factor`` without ``oom-memory-limit``, said. A need between two keys,
    which the spec cannot change: callers say it before the spec's own problems, so one
    apply shows both. With the pod template (``pod_spec``), what the limit is checked
    against is said too: the largest memory request, and the guard rail, so that the limit
    the message asks for is not denied next."""
    if policy.oom_memory_factor is None or policy.oom_memory_limit is not None:
        return False
    accepted = "e.g. 16Gi"
    largest = _largest_request(pod_spec) if pod_spec is not None else None
    rail = ctx.config.rails(ctx.namespace).max_oom_memory_limit if ctx is not None else None
    if largest is not None:
        accepted = f"accepted: at least {largest[1]} (container {largest[0]}'s memory request)"
        if rail is not None:
            accepted += f", at most {rail} (guardRails.maxOomMemoryLimit)"
    elif rail is not None:
        accepted = f"accepted: up to {rail} (guardRails.maxOomMemoryLimit)"
    out.conflict(
        policy,
        "oom-memory-factor",
        f"needs {PREFIX}oom-memory-limit, the most memory a container may get ({accepted})",
        "missing-memory-limit",
    )
    return True


def _largest_request(pod_spec: Mapping[str, Any]) -> tuple[str, quantity.Quantity] | None:
    """The container with the largest memory request (``request_of``), and that request."""
    found: tuple[str, quantity.Quantity] | None = None
    for name, container in named(pod_spec):
        request = request_of(container)
        if request is not None and (found is None or request.value > found[1].value):
            found = (name, request)
    return found


def check_memory(
    pod_spec: Mapping[str, Any], policy: Policy, ctx: Context, out: Outcome, where: str
) -> Policy:
    """``oom-memory-factor`` needs ``oom-memory-limit``, which must not exceed the guard
    rail nor be below a container's memory request (it could never be met); and memory
    set on the containers, not on the pod (``spec.resources``, PodLevelResources): a
    raise of the containers would not move a pod-level bound, so the promise of more
    memory would not be kept. Each is checked whatever the others find; a missing limit
    says what the limit checks would ask of it."""
    factor, limit = policy.oom_memory_factor, policy.oom_memory_limit
    if factor is None:
        if limit is not None and policy.setting("oom-memory-limit").source is Source.ANNOTATION:
            out.note("retry-policy: oom-memory-limit has no effect without oom-memory-factor")
        return policy
    shared = podspec.memory_of(pod_spec, "limits") or podspec.memory_of(pod_spec, "requests")
    if shared is not None:
        field = "spec.resources" if where == "this pod" else f"{where}.spec.resources"
        policy = out.refuse(
            policy,
            "oom-memory-factor",
            f"{field} sets pod-level memory ({shared}), which the pod's containers share: "
            "raising an OOM-killed container's memory would leave that bound where it is; "
            "accepted: memory set on the containers only",
            "pod-level-resources",
        )
        if policy.oom_memory_factor is None:
            return policy  # a default, skipped
    if limit is None:
        lacks_limit(policy, out, pod_spec, ctx)
        if policy.setting("oom-memory-factor").source is Source.ANNOTATION:
            return policy  # denied, and said what the limit must be: the rest still checked
        return off(policy, "oom-memory-factor")
    rail = ctx.config.rails(ctx.namespace).max_oom_memory_limit
    if rail is not None and limit.value > rail.value:
        out.problems.append(
            Problem(
                f"annotation {PREFIX}oom-memory-limit",
                f"{limit} is above this cluster's limit; accepted: a quantity up to {rail} "
                "(guardRails.maxOomMemoryLimit)",
                "guard-rail",
            )
        )
    largest = _largest_request(pod_spec)
    if largest is not None and largest[1].value > limit.value:
        name, request = largest
        upto = f" and at most {rail}" if rail is not None else ""
        policy = out.refuse(
            policy,
            "oom-memory-limit",
            f"{limit} is below the memory request of container {name} ({request}) in "
            f"{where}; accepted: a quantity of at least {request}{upto}",
            "memory-limit-too-low",
        )
        if policy.setting("oom-memory-limit").source is not Source.ANNOTATION:
            return off(policy, "oom-memory-factor")  # a default limit, skipped: no factor
    if any(p.reason == "guard-rail" for p in out.problems):
        return off(policy, "oom-memory-factor")
    return policy


def check_limit_ranges(policy: Policy, ctx: Context, out: Outcome) -> None:
    """A workload's warning when ``oom-memory-limit`` is above what the namespace's
    LimitRanges let a container or a pod have: its pods' raises stop there
    (``webhook.kube.limitrange``), below the limit the user set."""
    limit = policy.oom_memory_limit
    if policy.oom_memory_factor is None or limit is None:
        return
    bounds = ctx.cluster.limit_ranges(ctx.namespace or "").limits
    for what, bound in (("container", bounds.container_max), ("pod", bounds.pod_max)):
        if bound is not None and bound.value < limit.value:
            out.note(
                f"retry-policy: oom-memory-limit {limit} is above LimitRange {bound.source}'s "
                f"{what} max {bound.text}: memory raises stop there"
            )


def check_oom_retried(
    user_rules: list[Any], pod_spec: Mapping[str, Any], policy: Policy, out: Outcome, where: str
) -> Policy:
    """An OOM kill must be retried for more memory to help. Your rules are judged on the
    pods an OOM kill leaves (one per application container, exit code 137) as the Job
    controller judges them (``matchPodFailurePolicy``: in order, the first match wins);
    ``fail-non-retriable`` must count 137 as retriable."""
    seen: set[int] = set()
    for exit_, failure in fp.app_failures(pod_spec, (SIGKILL,)):
        if policy.oom_memory_factor is None:
            return policy  # a default, skipped
        match = fp.evaluate(user_rules, failure)
        if match is not None and match.action in ("FailJob", "FailIndex"):
            if match.index in seen:
                continue
            seen.add(match.index)
            policy = out.refuse(
                policy,
                "oom-memory-factor",
                f"your {where}.podFailurePolicy.rules[{match.index}] ({match.action}) matches "
                f"a pod whose container {exit_.name} was OOM-killed (exit code 137), so "
                "the OOM kill would not be retried with more memory",
                "contradiction",
            )
    codes = policy.retriable_exit_codes
    if policy.oom_memory_factor is None or not policy.fail_non_retriable or SIGKILL in codes:
        return policy
    setting = policy.setting("retriable-exit-codes")
    if setting.source in (Source.ANNOTATION, Source.SPEC):
        return out.refuse(
            policy,
            "oom-memory-factor",
            f"an OOM kill exits 137, which retriable-exit-codes "
            f"({format_value('retriable-exit-codes', codes)}) does not retry: "
            "fail-non-retriable would fail the Job instead; add 137 to retriable-exit-codes",
            "contradiction",
        )
    wider = tuple(sorted({*codes, SIGKILL}))
    out.note(
        f"retry-policy: exit code 137 added to retriable-exit-codes "
        f"({format_value('retriable-exit-codes', wider)}) so that OOM kills are retried "
        "with more memory (oom-memory-factor)"
    )
    return with_setting(
        policy, "retriable-exit-codes", Setting(wider, setting.source, setting.detail)
    )


#: Why an OOM kill is retried only where it exits 137. On cgroup v2 the kubelet makes the
#: OOM killer stop the whole container (``memory.oom.group``), unless its config sets
#: ``singleProcessOOMKill: true`` (``generateLinuxContainerResources`` in
#: pkg/kubelet/kuberuntime/kuberuntime_container_linux.go; the default is false on cgroup
#: v2 and true on cgroup v1, where it cannot be false: ``NewMainKubelet`` in
#: pkg/kubelet/kubelet.go). Killing one process of the container, the kernel may leave
#: its main process to exit with a code of its own (1 for a crashed worker pool), which
#: a podFailurePolicy, matching exit codes only, takes for a non-retriable failure.
OOM_SIGNAL = (
    "retry-policy: OOM kills exit 137 only on cgroup v2 without singleProcessOOMKill; "
    "else fail-non-retriable may fail them"
)


def check_oom_signal(policy: Policy, out: Outcome) -> None:
    """Say where an OOM kill is meant to be retried (``oom-memory-factor``, or 137 among
    the retriable codes) while ``fail-non-retriable`` fails every other exit code (once
    for all the Job specs of a workload). It is said with the FailJob rule, as what that
    rule assumes, not as a fault of the object: ``dry-run --fail-on-warn`` passes it."""
    if (
        policy.fail_non_retriable
        and (policy.oom_memory_factor is not None or SIGKILL in policy.retriable_exit_codes)
        and all(change.text != OOM_SIGNAL for change in out.changes)
    ):
        out.changed(OOM_SIGNAL)


def pod_values(policy: Policy) -> dict[str, str]:
    """The failure-aware settings a pod of this workload needs, in annotation grammar."""
    values: dict[str, str] = {}
    if policy.oom_memory_factor is not None and policy.oom_memory_limit is not None:
        values["oom-memory-factor"] = format_value("oom-memory-factor", policy.oom_memory_factor)
        values["oom-memory-limit"] = str(policy.oom_memory_limit)
    if policy.avoid_failed_nodes:
        values["avoid-failed-nodes"] = "true"
    return values


# --- what the pods' memory becomes ------------------------------------------------------


@dataclass(frozen=True)
class ContainerMemory:
    """A container's memory in one pod ("-": not set)."""

    container: str
    request: str
    limit: str


class MemoryPlan:
    """What ``oom-memory-factor`` gives each container of a pod template after its OOM
    kills, one attempt after another, each killed at the memory the one before gave it:
    the pod webhook's own arithmetic (``podspec.raise_memory``) on a copy."""

    def __init__(self, pod_spec: Mapping[str, Any], factor: Fraction, cap: quantity.Quantity):
        self.factor = factor
        self.cap = cap
        self.containers = {
            name: deep_copy(c)
            for c in podspec.containers(pod_spec)
            if isinstance(name := c.get("name"), str)
            and (podspec.memory_of(c, "requests") or podspec.memory_of(c, "limits"))
        }

    def at(self, name: str, kills: int) -> tuple[str, str]:
        """(request, limit) of container ``name`` after ``kills`` OOM kills ("-": unset)."""
        container = self.containers.get(name)
        if container is None:
            return "-", "-"
        container = deep_copy(container)
        for _ in range(kills):  # each attempt OOM-killed at the memory the last one gave
            podspec.raise_memory(container, self.factor, self.cap)
        return memory_text(container)


def memory_text(container: Mapping[str, Any]) -> tuple[str, str]:
    """(request, limit) of a container's memory ("-": unset)."""
    request, limit = (podspec.memory_of(container, k) for k in ("requests", "limits"))
    return (str(request) if request else "-", str(limit) if limit else "-")


def template_memory(pod_spec: Mapping[str, Any]) -> tuple[ContainerMemory, ...]:
    """The memory of each container of a pod template that sets some, as written."""
    found = []
    for container in podspec.containers(pod_spec):
        name = container.get("name")
        if isinstance(name, str) and (
            podspec.memory_of(container, "requests") or podspec.memory_of(container, "limits")
        ):
            found.append(ContainerMemory(name, *memory_text(container)))
    return tuple(found)


def memory_plan(pod_spec: Mapping[str, Any], pods: Policy) -> MemoryPlan | None:
    """The plan of a template whose pods raise memory (its annotations say so)."""
    factor, cap = pods.oom_memory_factor, pods.oom_memory_limit
    if factor is None or cap is None:
        return None
    return MemoryPlan(pod_spec, factor, cap)
