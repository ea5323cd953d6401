"""In-place retries: a container that exits with a chosen code restarts where it runs.

``in-place-exit-codes`` gives every regular container of a pod template ``restartPolicy:
Never`` and a container restart rule (KEP-5307) ``Restart`` on ``exitCodes: {operator:
In, values: <codes>}``, after the container's own rules (the kubelet takes the first
that matches: ``findMatchingContainerRestartRule`` in pkg/api/v1/pod/util.go). With
``in-place-scope: pod`` the action is ``RestartAllContainers`` (KEP-5532): the whole pod
restarts on its node, init containers first. Native sidecars and other init containers
keep their own behaviour: a sidecar already restarts on every exit, and an init
container's failure is a failed start, not the application's retriable exit. A regular
container with its own ``restartPolicy: OnFailure`` or ``Always`` is left as it is (said
in a warning): it already restarts in place on its failures (``ContainerShouldRestart``:
OnFailure on a non-zero exit, Always on every exit).

What the raw API makes easy to get wrong is checked here:

- **Version.** With ``ContainerRestartRules`` off the API server drops the fields
  silently (``dropContainerRestartRules``, called from ``dropDisabledFields`` in
  pkg/api/pod/util.go); with ``RestartAllContainersOnContainerExits`` off it refuses that
  action (``AllowRestartAllContainers`` in ``GetValidationOptionsFromPodSpecAndMeta``). So
  they are written only for a cluster whose version has them on by default (1.35 for the
  rules, 1.36 for RestartAllContainers); an unknown version writes nothing.
- **Nodes.** A pod with a ``RestartAllContainers`` rule is a node-declared feature
  (``InferForScheduling`` of k8s.io/component-helpers/nodedeclaredfeatures/features/
  restartallcontainers): the scheduler places it only on nodes whose kubelet declares
  ``RestartAllContainersOnContainerExits``; elsewhere it stays Pending. Said at admission.
- **Bound.** A restart in place is not a pod failure: under a pod ``restartPolicy:
  Never`` the Job controller counts none of them (``pastBackoffLimitOnFailure`` counts
  restarts only under ``OnFailure``), so only a deadline ends a container that always
  exits 42. One is required (``activeDeadlineSeconds`` of the Job, the pod, a JobSet's
  replicated Job or a TrainJob), or an admin's default deadline, or an admin's explicit
  permission to run unbounded (then every admission warns). A deadline after which
  something restarts the work without counting (a JobSet rule ending in
  ``AndIgnoreMaxRestarts``) is no bound (``Bound.unbounded``).
- **Consistency.** A podFailurePolicy rule of the user's that fails the Job on in-place
  codes of a regular container it names could never fire, and is denied; one without
  ``containerName`` still fires for init containers (``matchOnExitCodes`` reads them after
  the regular ones) and is only warned about. 137 restarting in place keeps the memory
  ``oom-memory-factor`` would raise. ``fail-non-retriable`` treats in-place codes as
  retriable in the rules of the regular containers (``retriable``): they reach the Job
  controller only from a node whose kubelet does not restart in place, and then a new pod
  is the retry the user asked for; init containers keep the plain retriable set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.kube import failurepolicy as fp
from webhook.kube import jobcontroller
from webhook.kube.objects import items, mapping
from webhook.kube.restartrules import MAX_CONTAINER_RULES, RESTART, RESTART_ALL
from webhook.kube.versions import CONTAINER_RESTART_RULES, RESTART_ALL_CONTAINERS
from webhook.plan.outcome import Context, Outcome
from webhook.policy.model import Policy, Setting, Source, with_setting

ACTIONS = {"container": RESTART, "pod": RESTART_ALL}


def retriable(policy: Policy) -> tuple[int, ...]:
    """The exit codes ``fail-non-retriable`` retries in a regular container: the retriable
    ones and the in-place ones (see the module's docstring). An init container's rule
    keeps ``policy.retriable_exit_codes``: nothing restarts it in place on those codes."""
    return tuple(sorted(set(policy.retriable_exit_codes) | set(policy.in_place_exit_codes)))


def recognised(policy: Policy) -> tuple[tuple[int, ...], ...]:
    """The NotIn lists of the exit-code rules ``fail-non-retriable`` writes for ``policy``:
    a regular container's and an init container's (one when there are no in-place codes),
    for recognising those rules in a stored object."""
    plain = tuple(sorted(set(policy.retriable_exit_codes)))
    ours = retriable(policy)
    return (ours,) if ours == plain else (ours, plain)


def rule(policy: Policy) -> dict[str, Any]:
    """The container restart rule ``policy`` writes."""
    return {
        "action": ACTIONS[policy.in_place_scope],
        "exitCodes": {"operator": "In", "values": list(policy.in_place_exit_codes)},
    }


@dataclass(frozen=True)
class Bound:
    """What ends in-place restarts that never stop: whether a deadline that ends them is
    set (``present``), and the ones a user could set (``fields``, for the message).
    ``unbounded`` says why a deadline that is set ends nothing (e.g. a JobSet rule that
    restarts without counting once it passes); then the admin's default deadline, written
    the same way, would end nothing either."""

    present: bool
    fields: str
    unbounded: str = ""
    #: Whether a pod that fails once restarted in place is counted where it runs out:
    #: then ``max-in-place-restarts`` bounds them too (``with_budget``). Not when a JobSet
    #: rule restarts the set without counting once the Job runs out of retries.
    replaced_counted: bool = True
    #: Set when ``max-in-place-restarts`` is what ends them.
    budget: int | None = None


def with_budget(bound: Bound, policy: Policy) -> Bound:
    """``bound``, ended by ``max-in-place-restarts`` too: each pod is replaced after N
    restarts in place and its failure counted (``webhook.controller.restarts``), so the
    retry budget ends them, N x (retries + 1) at most; the deadline stays the bound when
    the key is absent."""
    n = policy.max_in_place_restarts
    if n is None or not bound.replaced_counted:
        return bound
    return dataclasses.replace(bound, present=True, budget=n)


def deadline_set(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def job_spec_bounded(job_spec: Mapping[str, Any]) -> bool:
    """A JobSpec whose own deadline, or its pod template's, ends in-place restarts."""
    pod_spec = mapping(mapping(job_spec.get("template")).get("spec"))
    return deadline_set(job_spec.get("activeDeadlineSeconds")) or deadline_set(
        pod_spec.get("activeDeadlineSeconds")
    )


def _off(policy: Policy) -> Policy:
    return with_setting(policy, "in-place-exit-codes", Setting(None, Source.BUILTIN))


def check(
    policy: Policy,
    pod_spec: Mapping[str, Any],
    ctx: Context,
    out: Outcome,
    where: str,
    bound: Bound,
    user_rules: Sequence[Any] = (),
) -> tuple[Policy, int | None]:
    """Whether ``policy``'s in-place restarts can act on this pod template (``where`` its
    path, e.g. ``spec.template``; "" for a Pod's own spec); a conflict turns them off
    (denied when annotated, skipped with a warning from a default). Returns the policy
    and, when a default deadline must be written to bound them, that deadline."""
    if not policy.in_place_exit_codes:
        return policy, None
    for check_one in (_version, _restart_policies, _user_rules, _oom):
        policy = _settle(policy, check_one(policy, pod_spec, ctx, where, user_rules), out)
        if not policy.in_place_exit_codes:
            return policy, None
    policy, deadline = settle_bound(policy, bound, ctx, out)
    if policy.in_place_exit_codes:
        for note in user_rule_notes(policy, pod_spec, where, user_rules):
            out.note(note)
    return policy, deadline


def settle_bound(
    policy: Policy, bound: Bound, ctx: Context, out: Outcome, why: str = "backoffLimit never"
) -> tuple[Policy, int | None]:
    """Restarts in place need something to end them: ``bound``, else the admin's default
    deadline (returned, for the caller to write), else the admin's permission to run
    unbounded (warned), else a conflict."""
    if bound.present:
        return policy, None
    rails = ctx.config.rails(ctx.namespace)
    if rails.in_place_deadline_seconds is not None and not bound.unbounded:
        return policy, rails.in_place_deadline_seconds
    if rails.allow_unbounded_in_place:
        out.note(
            "retry-policy: in-place restarts are unbounded (guardRails.allowUnboundedInPlace): "
            f"set {bound.fields} to end a container that never stops failing"
        )
        return policy, None
    message = f"restarts in place are not pod failures, so {why} ends them: set {bound.fields}"
    if bound.unbounded:
        message = f"restarts in place are not pod failures, and {bound.unbounded}"
    out.conflict(policy, "in-place-exit-codes", message, "unbounded")
    return _off(policy), None


def check_version(policy: Policy, ctx: Context, out: Outcome) -> Policy:
    """Only the version check, for a workload whose pod templates are not known here (a
    TrainJob whose runtime was not read): the rest is checked where they are."""
    if not policy.in_place_exit_codes:
        return policy
    return _settle(policy, _version(policy, {}, ctx, "", ()), out)


Found = tuple[str, str, str]  # (message, the setting it is about, reason); "" when fine
_FINE: Found = ("", "", "")


def _settle(policy: Policy, found: Found, out: Outcome) -> Policy:
    """A check's finding as a conflict (denied when annotated, skipped from a default):
    a wrong scope falls back to the container scope; a default is turned off, an annotated
    setting stays on so that the independent checks after it still run
    (``Outcome.refuse``)."""
    message, name, reason = found
    if not message:
        return policy
    if name == "in-place-scope":
        out.conflict(policy, name, message, reason)
        return with_setting(policy, name, Setting("container", Source.BUILTIN))
    # Annotated, it stays asked for: the checks after this one still say their problems.
    return out.refuse(policy, name, message, reason)


def _version(
    policy: Policy, pod_spec: Mapping[str, Any], ctx: Context, where: str, rules: Sequence[Any]
) -> Found:
    version = ctx.kubernetes_version
    if version is None:
        return (
            "the cluster's Kubernetes version is not known (its API server's /version could "
            "not be read), and the API server drops these fields where they are off: set "
            "kubernetesVersion in the webhook's config",
            "in-place-exit-codes",
            "unknown-version",
        )
    gate = CONTAINER_RESTART_RULES
    if version < gate.on_since:
        return (
            f"{gate.what} need Kubernetes {gate.on_since} or newer ({gate.name}); this cluster "
            f"is {version}, whose API server would drop them",
            "in-place-exit-codes",
            "kubernetes-version",
        )
    gate = RESTART_ALL_CONTAINERS
    if policy.in_place_scope == "pod" and version < gate.on_since:
        return (
            f"pod needs {gate.what}, Kubernetes {gate.on_since} or newer ({gate.name}); this "
            f"cluster is {version}; use container",
            "in-place-scope",
            "kubernetes-version",
        )
    return _FINE


def spec_path(where: str) -> str:
    """The path of the pod spec whose template is at ``where`` ("" for a Pod's own)."""
    return f"{where}.spec" if where else "spec"


def takes_rule(container: Mapping[str, Any]) -> bool:
    """Whether a regular container gets the rule. One with its own restartPolicy
    ``OnFailure`` or ``Always`` already restarts in place on its failures and is left as
    it is (``ContainerShouldRestart``: OnFailure on a non-zero exit, Always on every
    exit, success too): a rule of ours would change only what restarts with it."""
    return container.get("restartPolicy") in (None, "Never")


def _restart_policies(
    policy: Policy, pod_spec: Mapping[str, Any], ctx: Context, where: str, rules: Sequence[Any]
) -> Found:
    restart = pod_spec.get("restartPolicy", "Always")
    field = f"{spec_path(where)}.restartPolicy"
    if restart == "OnFailure":
        return (
            f"{field} is OnFailure, which already restarts every failed container in place; "
            "in-place-exit-codes needs Never; "
            + jobcontroller.never_instead_in_place(field, template=bool(where)),
            "in-place-exit-codes",
            "restart-policy",
        )
    if restart != "Never":
        return (
            f"{field} is {restart!r}; in-place-exit-codes needs Never",
            "in-place-exit-codes",
            "restart-policy",
        )
    wanted = rule(policy)
    for container in fp.named_containers(pod_spec, "containers"):
        rules_of = items(container.get("restartPolicyRules"))
        if (
            takes_rule(container)
            and wanted not in rules_of
            and len(rules_of) >= MAX_CONTAINER_RULES
        ):
            return (
                f"container {container['name']} already has {len(rules_of)} restartPolicyRules; "
                f"Kubernetes allows at most {MAX_CONTAINER_RULES}",
                "in-place-exit-codes",
                "too-many-rules",
            )
    return _FINE


def _user_rules(
    policy: Policy, pod_spec: Mapping[str, Any], ctx: Context, where: str, rules: Sequence[Any]
) -> Found:
    """A rule of the user's that fails the Job (or index) only on in-place codes of a
    regular container it names could never fire: that container restarts in place before
    the pod could fail with them (every regular container does: by our rule, or by its own
    restartPolicy OnFailure or Always). Partial overlaps and rules without
    ``containerName`` can still fire (``user_rule_notes``)."""
    regular = {c["name"] for c in fp.named_containers(pod_spec, "containers")}
    for index, rule_ in enumerate(rules):
        both, values, container = _overlap(policy, rule_)
        if both and container in regular and len(both) == len(values):
            return (
                f"your {_pfp(where)}.rules[{index}] ({rule_['action']}) fails only on "
                f"{_codes(both)} of container {container}, which restarts in place on "
                f"{'it' if len(both) == 1 else 'them'} instead: it could never fire",
                "in-place-exit-codes",
                "contradiction",
            )
    return _FINE


def _pfp(where: str) -> str:
    return f"{where.rsplit('.template', 1)[0]}.podFailurePolicy"


def _overlap(policy: Policy, rule_: Any) -> tuple[list[int], set[int], str | None]:
    """Of a FailJob or FailIndex rule with operator In: its in-place codes, all its codes,
    and the container it names."""
    if not isinstance(rule_, dict) or rule_.get("action") not in ("FailJob", "FailIndex"):
        return [], set(), None
    on = mapping(rule_.get("onExitCodes"))
    if on.get("operator") != "In":
        return [], set(), None
    values = {v for v in items(on.get("values")) if isinstance(v, int) and not isinstance(v, bool)}
    container = on.get("containerName")
    both = sorted(set(policy.in_place_exit_codes) & values)
    return both, values, container if isinstance(container, str) else None


def user_rule_notes(
    policy: Policy, pod_spec: Mapping[str, Any], where: str, rules: Sequence[Any]
) -> list[str]:
    """Warnings for the user's FailJob/FailIndex rules that fail on in-place codes but can
    still fire: without ``containerName`` the Job controller also reads init containers
    (``matchOnExitCodes``: regular containers first, then init containers), and a rule
    that names other codes too fires on those."""
    regular = {c["name"] for c in fp.named_containers(pod_spec, "containers")}
    notes = []
    for index, rule_ in enumerate(rules):
        both, values, container = _overlap(policy, rule_)
        if not both or (container is not None and container not in regular):
            continue
        them = "it" if len(both) == 1 else "them"
        rule_ = f"retry-policy: your {_pfp(where)}.rules[{index}]"
        if container is None:
            notes.append(
                f"{rule_} fires on {_codes(both)} only for init containers: the regular ones "
                f"restart in place on {them}"
            )
        elif len(both) < len(values):
            notes.append(
                f"{rule_} never fires on {_codes(both)} of container {container}: it restarts "
                f"in place on {them}"
            )
    return notes


def _oom(
    policy: Policy, pod_spec: Mapping[str, Any], ctx: Context, where: str, rules: Sequence[Any]
) -> Found:
    if 137 in policy.in_place_exit_codes and policy.oom_memory_factor is not None:
        return (
            "137 (an OOM kill) would restart in place, on the same node with the same memory, "
            "so oom-memory-factor could never raise it; take 137 out of one of them",
            "in-place-exit-codes",
            "contradiction",
        )
    return _FINE


def _codes(codes: Iterable[int]) -> str:
    values = list(codes)
    return ("exit code " if len(values) == 1 else "exit codes ") + ", ".join(map(str, values))


#: Said whenever a pod template gets RestartAllContainers (kept under 120 characters).
NODES_NOTE = (
    "retry-policy: in-place-scope pod: pods stay Pending unless a node declares "
    "RestartAllContainersOnContainerExits"
)


# --- what ends them, as the final object says -------------------------------------------


@dataclass(frozen=True)
class Deadline:
    field: str
    seconds: int
    source: str

    def __str__(self) -> str:
        return f"{self.field} ({self.seconds} s, {self.source})"


@dataclass(frozen=True)
class InPlaceEnds:
    """What ends restarts in place that never stop, as the final object says: the deadlines
    that apply (the whole run's, ``whole``, and each pod's, ``pod``), or an outer one named
    in words. ``Bound`` is the same fact as admission judges it before writing (whether a
    deadline is set, what to set); ``explain`` and ``status`` read this one."""

    whole: Deadline | None = None
    pod: Deadline | None = None
    #: A deadline outside the object, in words ("": none; e.g. a TrainJob's).
    outer: str | None = None
    unbounded_allowed: bool = False
    #: What fails when the whole run's deadline passes ("the Job").
    owner: str = "Job"
    #: What follows that failure, when something outside decides ("; then the JobSet's ...").
    then: str = ""
    #: The field to set when nothing bounds them.
    missing: str = "spec.activeDeadlineSeconds"
    #: Why the deadlines that are set end nothing (a JobSet rule that then restarts the
    #: set without counting: ``kinds.jobset.rules.in_place_bound``).
    ends_nothing: str = ""
    #: ``max-in-place-restarts``, in words, when it ends them (``inplace.with_budget``).
    budget: str = ""

    @property
    def bounded(self) -> bool:
        return bool(self.budget) or (
            bool(self.whole or self.pod or self.outer) and not self.ends_nothing
        )
