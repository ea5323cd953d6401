"""batch/v1 ``podFailurePolicy``: building our rules, merging, API validation, evaluation.

One module holds everything about the rule language so that mutation, validation,
the attempt cache (which must know which failures an ``Ignore`` rule hides) and
``explain`` all agree on what a rule means. Evaluation follows the Job controller
(kubernetes/kubernetes pkg/controller/job/pod_failure_policy.go, ``matchPodFailurePolicy``):
rules in order, the first match wins; a rule with an action the controller does not know
is skipped; exit-code rules look at terminated containers only, regular containers before
init containers, never at a container that exited 0 (for ``In`` and ``NotIn`` alike), and
``containerName`` narrows the match; condition rules match a pod condition on type and
status, taking the pod's conditions in their order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from webhook.problems import Problem

ACTIONS = ("FailJob", "FailIndex", "Ignore", "Count")
MAX_RULES = 20
MAX_EXIT_CODE_VALUES = 255
MAX_POD_CONDITION_PATTERNS = 20
CONDITION_STATUSES = ("True", "False", "Unknown")
DISRUPTION_TARGET = "DisruptionTarget"
#: Pod conditions the webhook's controller adds, each matched by a rule of ours that comes
#: before every other rule: a pod has one only because its workload asked for it.
OURS = "retry-policy.dev/"
#: A disrupted pod of a workload that has used its ``max-disruptions``.
DISRUPTION_BUDGET_EXHAUSTED = OURS + "DisruptionBudgetExhausted"
#: A pod replaced after ``max-in-place-restarts`` restarts in place.
IN_PLACE_BUDGET_EXHAUSTED = OURS + "InPlaceBudgetExhausted"
#: A running peer of a disrupted pod (``peer-disruptions``).
PEER_DISRUPTED = OURS + "PeerDisrupted"
#: A free failure (``free-categories``) past ``max-free-failures``.
FREE_BUDGET_EXHAUSTED = OURS + "FreeBudgetExhausted"
OUR_CONDITIONS = (
    IN_PLACE_BUDGET_EXHAUSTED,
    DISRUPTION_BUDGET_EXHAUSTED,
    PEER_DISRUPTED,
    FREE_BUDGET_EXHAUSTED,
)
#: Besides these, a failure category is one of ours too: ``retry-policy.dev/<Category>``
#: (``webhook.policy.categories``), which only our controller writes.
#: ``ValidateQualifiedName`` (k8s.io/apimachinery pkg/util/validation): an optional DNS
#: subdomain prefix and a name of at most 63 characters, alphanumeric at both ends.
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def non_retriable_rule(
    retriable: Iterable[int], action: str = "FailJob", container: str | None = None
) -> dict[str, Any]:
    """Fail (the Job, or the index) on any exit code outside the retriable set; with
    ``container``, only on that container's exit code."""
    codes: dict[str, Any] = {"operator": "NotIn", "values": sorted(set(retriable))}
    if container is not None:
        codes = {"containerName": container, **codes}
    return {"action": action, "onExitCodes": codes}


def non_retriable_rules(
    pod_spec: Mapping[str, Any],
    retriable: Iterable[int],
    action: str = "FailJob",
    restarting: Iterable[int] = (),
) -> list[dict[str, Any]]:
    """One ``non_retriable_rule`` per application container of the pod template
    (``app_containers``), each naming its container. ``restarting`` are codes on which
    the regular containers restart in place: their rules retry those too; an init
    container's keep ``retriable`` (nothing restarts it in place).

    A rule without ``containerName`` would also read the exit codes of native sidecars
    and of containers injected after admission (a service mesh's proxy): the controller
    matches every terminated container, init containers included
    (``matchOnExitCodes``), and a sidecar SIGKILLed at pod shutdown reports 137, which
    would turn a retriable failure of the main container into FailJob. Naming the
    template's own containers makes only the application's codes count. A template with
    no named container (refused by the API server) gets the one rule without a name.
    """
    codes = sorted(set(retriable))
    regular_codes = sorted(set(codes) | set(restarting))
    regular_names = [c["name"] for c in named_containers(pod_spec, "containers")]
    init = [c["name"] for c in named_containers(pod_spec, "initContainers") if not is_sidecar(c)]
    names = regular_names + init  # (``app_containers``)
    if not names:
        return [non_retriable_rule(regular_codes, action)]
    regular = set(regular_names)
    # Each as ``non_retriable_rule`` builds it, with a list of codes of its own.
    return [
        {
            "action": action,
            "onExitCodes": {
                "containerName": name,
                "operator": "NotIn",
                "values": list(regular_codes if name in regular else codes),
            },
        }
        for name in names
    ]


def is_non_retriable_rule(rule: Any, retriable: Iterable[int] | None = None) -> bool:
    """Whether ``rule`` has the shape ``non_retriable_rule`` builds (any container, or
    none), for ``retriable`` codes when given: how this webhook's own rules are recognised
    in a stored object (by ``explain``, and by a CronJob's re-admission)."""
    if not isinstance(rule, dict) or rule.get("action") not in ("FailJob", "FailIndex"):
        return False
    codes = rule.get("onExitCodes")
    if not isinstance(codes, dict) or codes.get("operator") != "NotIn":
        return False
    if set(codes) - {"operator", "values", "containerName"} or set(rule) - {
        "action",
        "onExitCodes",
    }:
        return False
    values = codes.get("values")
    if not _int_list(values):
        return False
    return retriable is None or values == sorted(set(retriable))


def ignore_disruptions_rule() -> dict[str, Any]:
    """Preemption, eviction and drains mark the pod ``DisruptionTarget=True``: do not count."""
    return {
        "action": "Ignore",
        "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}],
    }


def count_disruptions_rule() -> dict[str, Any]:
    """A disrupted pod counts against the budget like any retriable failure, whatever its
    containers exited with. ``fail-non-retriable`` puts it before its exit-code rules:
    a pod preempted, evicted or drained is SIGKILLed (137) once its grace period is over,
    and an application may exit 1 on SIGTERM; the first matching rule wins
    (``matchPodFailurePolicy``), so without it such a pod would fail the Job."""
    return {
        "action": "Count",
        "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}],
    }


def condition_rule(condition: str, action: str = "Count") -> dict[str, Any]:
    """A rule on one of the conditions our controller adds (``OUR_CONDITIONS``)."""
    return {"action": action, "onPodConditions": [{"type": condition, "status": "True"}]}


def on_our_conditions(rule: Any) -> bool:
    """Whether ``rule`` is on a condition only our controller adds (``OUR_CONDITIONS`` and
    the failure categories, all ``retry-policy.dev/``): such a rule goes before every other
    (``merge``), and matches no pod but those its workload asked us to mark."""
    if not isinstance(rule, dict) or not isinstance(rule.get("onPodConditions"), list):
        return False
    types = [p.get("type") for p in rule["onPodConditions"] if isinstance(p, dict)]
    return bool(types) and all(isinstance(t, str) and t.startswith(OURS) for t in types)


def qualified_name(value: str) -> bool:
    """``ValidateQualifiedName``: what a pod condition's type must be, and so a rule's
    (``validatePodFailurePolicyRuleOnPodConditions``; a pod's custom conditions are held to
    it too by ``validatePodConditions``, pkg/apis/core/validation/validation.go)."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or _DNS_SUBDOMAIN.fullmatch(prefix) is None):
        return False
    return len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def takes_disruptions(rules: Iterable[Any]) -> bool:
    """Whether a rule of ``rules`` matches a disrupted pod by its condition
    (``DisruptionTarget=True``; a pattern on another status never matches such a pod)
    and is not ``count_disruptions_rule`` (ours, there on a second admission): whoever
    wrote it decided what a disruption does, and a rule after it never sees one."""
    match = evaluate(rules, _DISRUPTED)
    return match is not None and rule_key(match.rule) != rule_key(count_disruptions_rule())


def rule_key(rule: Any) -> Any:
    """A hashable normal form: two rules with equal keys mean exactly the same thing."""
    if not isinstance(rule, dict):
        return ("invalid", repr(rule))
    codes = rule.get("onExitCodes")
    conditions = rule.get("onPodConditions")
    codes_key = None
    if isinstance(codes, dict):
        values = codes.get("values")
        values_key = tuple(sorted(values)) if _int_list(values) else repr(values)
        name, operator = codes.get("containerName"), codes.get("operator")
        codes_key = (
            name if name is None or isinstance(name, _SCALARS) else repr(name),
            operator if operator is None or isinstance(operator, _SCALARS) else repr(operator),
            values_key,
        )
    conditions_key = None
    if isinstance(conditions, list):
        conditions_key = tuple(
            sorted(
                (str(c.get("type")), str(c.get("status") or "True"))
                for c in conditions
                if isinstance(c, dict)
            )
        )
    action = rule.get("action")
    if action is not None and not isinstance(action, _SCALARS):
        action = repr(action)
    return (action, codes_key, conditions_key)


#: What ``rule_key`` keeps as it is (hashable); anything else by its repr (a malformed
#: rule's list or mapping).
_SCALARS = (str, int, float)


def _int_list(values: Any) -> TypeGuard[list[int]]:
    if not isinstance(values, list):
        return False
    if set(map(type, values)) <= _INT:  # (the usual list: plain ints, checked in C)
        return True
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


_INT = {int}


def merge(user_rules: list[Any], ours: list[dict[str, Any]]) -> tuple[list[Any], list[dict]]:
    """The user's rules first (their order is their intent), then ours not already there;
    but the rules on conditions only our controller adds (``on_our_conditions``) come before all:
    the user asked for them by annotation, and a pod matches them only once our
    controller marked it so (a rule of the user's first would decide that pod instead).

    A rule of ours the input already holds (a manifest copied from a Job an earlier
    version of the webhook mutated) keeps its place, and the ones we add before it in our
    order go just before it: otherwise a rule meant to decide first (Count on
    DisruptionTarget) would land after the exit-code rule it must precede (the Job
    controller takes the first match). ``ours`` are fresh dicts built for this request;
    they are placed as they are.
    """
    merged = list(user_rules)
    keys = [rule_key(rule) for rule in merged]
    leading, rest = [], []
    for rule in ours:
        (leading if on_our_conditions(rule) else rest).append((rule, rule_key(rule)))
    added = _place(merged, keys, rest, False)
    added += _place(merged, keys, leading, True)
    placed = {id(rule) for rule in added}
    return merged, [r for r in ours if id(r) in placed]


def _place(
    merged: list[Any], keys: list[Any], ours: list[tuple[dict[str, Any], Any]], leading: bool
) -> list[dict]:
    """Put each of ``ours`` (rule, ``rule_key``) missing from ``merged`` (whose keys are
    ``keys``, kept in step) just before the next of ours already there, else after the
    last (``leading``: after the last of ours placed, or first); the ones put."""
    present = set(keys)
    added = []
    after = 0
    for position, (rule, key) in enumerate(ours):
        if key in present:
            after = keys.index(key) + 1
            continue
        later = [keys.index(k) for _, k in ours[position + 1 :] if k in present]
        at = min(later) if later else (after if leading else len(merged))
        merged.insert(at, rule)
        keys.insert(at, key)
        present.add(key)
        added.append(rule)
        after = at + 1
    return added


def named_containers(pod_spec: Mapping[str, Any], group: str) -> list[dict[str, Any]]:
    items = pod_spec.get(group)
    return [
        c
        for c in (items if isinstance(items, list) else ())
        if isinstance(c, dict) and isinstance(c.get("name"), str)
    ]


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """A native sidecar: an init container with ``restartPolicy: Always``. It runs beside
    the regular containers and is stopped at pod shutdown (SIGTERM, then SIGKILL after
    the grace period), so its exit code says nothing about the application."""
    return container.get("restartPolicy") == "Always"


def app_containers(pod_spec: Mapping[str, Any]) -> list[str]:
    """The containers whose exit codes are the application's, in the order the Job
    controller reads them: the regular containers, then the init containers that are not
    sidecars (an init container that fails stops the pod, like a regular one)."""
    regular = [c["name"] for c in named_containers(pod_spec, "containers")]
    init = [c["name"] for c in named_containers(pod_spec, "initContainers") if not is_sidecar(c)]
    return regular + init


def sidecar_containers(pod_spec: Mapping[str, Any]) -> list[str]:
    return [c["name"] for c in named_containers(pod_spec, "initContainers") if is_sidecar(c)]


def container_names(pod_spec: Mapping[str, Any]) -> set[str]:
    return {
        c["name"]
        for group in ("initContainers", "containers")
        for c in named_containers(pod_spec, group)
    }


def validate(job_spec: Mapping[str, Any], where: str = "spec") -> list[Problem]:
    """Every API-server rule for ``podFailurePolicy`` (``validatePodFailurePolicy`` and
    ``validatePodFailurePolicyRule``, pkg/apis/batch/validation/validation.go), as
    problems.

    Running these before the API server does lets the denial name the annotation that
    caused the breach instead of a field the user never wrote.
    """
    policy = job_spec.get("podFailurePolicy")
    if policy is None:
        return []
    base = f"{where}.podFailurePolicy"
    if not isinstance(policy, dict) or not isinstance(policy.get("rules"), list):
        return [Problem(base, "must be an object with a list of rules")]
    problems: list[Problem] = []
    rules = policy["rules"]
    if len(rules) > MAX_RULES:
        problems.append(
            Problem(
                f"{base}.rules",
                f"has {len(rules)} rules; Kubernetes allows at most {MAX_RULES}",
                "too-many-rules",
            )
        )
    template = job_spec.get("template") or {}
    pod_spec = template.get("spec") or {} if isinstance(template, dict) else {}
    names = container_names(pod_spec) if isinstance(pod_spec, dict) else set()
    for index, rule in enumerate(rules):
        problems.extend(_validate_rule(rule, f"{base}.rules[{index}]", names, job_spec))
    restart = pod_spec.get("restartPolicy") if isinstance(pod_spec, dict) else None
    # Any policy, an empty rule list too (``validateJobSpec``: ``PodFailurePolicy != nil``).
    if restart != "Never":
        problems.append(
            Problem(
                f"{where}.template.spec.restartPolicy",
                f"is {restart!r}; a podFailurePolicy needs restartPolicy: Never",
                "restart-policy",
            )
        )
    replacement = job_spec.get("podReplacementPolicy")
    if replacement not in (None, "Failed"):
        problems.append(
            Problem(
                f"{where}.podReplacementPolicy",
                f"is {replacement!r}; with a podFailurePolicy only Failed is allowed",
                "replacement-policy",
            )
        )
    return problems


def _validate_rule(
    rule: Any, where: str, names: set[str], job_spec: Mapping[str, Any]
) -> list[Problem]:
    if not isinstance(rule, dict):
        return [Problem(where, "must be an object")]
    problems = []
    action = rule.get("action")
    if action not in ACTIONS:
        problems.append(
            Problem(f"{where}.action", f"{action!r} is not one of {', '.join(ACTIONS)}")
        )
    if action == "FailIndex" and job_spec.get("backoffLimitPerIndex") is None:
        problems.append(Problem(f"{where}.action", "FailIndex needs spec.backoffLimitPerIndex"))
    codes = rule.get("onExitCodes")
    conditions = rule.get("onPodConditions")
    if (codes is None) == (conditions is None):
        problems.append(Problem(where, "needs exactly one of onExitCodes or onPodConditions"))
    if codes is not None:
        problems.extend(_validate_codes(codes, f"{where}.onExitCodes", names))
    if conditions is not None:
        problems.extend(_validate_conditions(conditions, f"{where}.onPodConditions"))
    return problems


def _validate_codes(codes: Any, where: str, names: set[str]) -> list[Problem]:
    if not isinstance(codes, dict):
        return [Problem(where, "must be an object")]
    problems = []
    operator = codes.get("operator")
    if operator not in ("In", "NotIn"):
        problems.append(Problem(f"{where}.operator", f"{operator!r} is not In or NotIn"))
    values = codes.get("values")
    if not _int_list(values) or not values:
        return [*problems, Problem(f"{where}.values", "must be a non-empty list of integers")]
    if len(values) > MAX_EXIT_CODE_VALUES:
        problems.append(Problem(f"{where}.values", f"has {len(values)} entries; at most 255"))
    if len(set(values)) != len(values):
        problems.append(Problem(f"{where}.values", "must not repeat a value"))
    if list(values) != sorted(values):
        problems.append(Problem(f"{where}.values", "must be sorted in ascending order"))
    if operator == "In" and 0 in values:
        problems.append(Problem(f"{where}.values", "must not contain 0 with operator In"))
    name = codes.get("containerName")
    if name is not None and name not in names:
        problems.append(
            Problem(f"{where}.containerName", f"{name!r} is not a container of the pod template")
        )
    return problems


def _validate_conditions(conditions: Any, where: str) -> list[Problem]:
    if not isinstance(conditions, list) or not conditions:
        return [Problem(where, "must be a non-empty list")]
    problems = []
    if len(conditions) > MAX_POD_CONDITION_PATTERNS:
        problems.append(Problem(where, f"has {len(conditions)} patterns; at most 20"))
    for i, pattern in enumerate(conditions):
        if not isinstance(pattern, dict) or not isinstance(pattern.get("type"), str):
            problems.append(Problem(f"{where}[{i}]", "needs a condition type"))
            continue
        if not qualified_name(pattern["type"]):
            problems.append(
                Problem(
                    f"{where}[{i}].type",
                    f"{pattern['type']!r} is not a qualified name ([prefix/]name, the name "
                    "at most 63 characters: letters, digits, -, _ and .)",
                )
            )
        status = pattern.get("status", "True")
        if status not in CONDITION_STATUSES:
            problems.append(
                Problem(f"{where}[{i}].status", f"{status!r} is not True, False or Unknown")
            )
    return problems


# --- evaluation -------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerExit:
    name: str
    exit_code: int
    init: bool = False


@dataclass(frozen=True)
class PodFailure:
    """What the Job controller looks at when a pod fails."""

    exits: tuple[ContainerExit, ...] = ()
    conditions: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodFailure:
        status = pod.get("status") or {}
        exits = []
        for group, init in (("containerStatuses", False), ("initContainerStatuses", True)):
            for cs in status.get(group) or []:
                terminated = ((cs or {}).get("state") or {}).get("terminated")
                if isinstance(terminated, dict) and isinstance(terminated.get("exitCode"), int):
                    exits.append(ContainerExit(str(cs.get("name")), terminated["exitCode"], init))
        conditions = tuple(
            (str(c.get("type")), str(c.get("status")))
            for c in status.get("conditions") or []
            if isinstance(c, dict)
        )
        return cls(tuple(exits), conditions)


#: A pod with the DisruptionTarget condition, as ``takes_disruptions`` asks about it.
_DISRUPTED = PodFailure((), ((DISRUPTION_TARGET, "True"),))


@dataclass(frozen=True)
class Match:
    index: int
    action: str
    rule: Mapping[str, Any] = field(compare=False)
    container: ContainerExit | None = None
    condition: str | None = None

    @property
    def counts(self) -> bool:
        """Whether the failure counts against backoffLimit: every action but Ignore does
        (the controller's ``countFailed``; FailJob and FailIndex count too)."""
        return self.action != "Ignore"


def counts(match: Match | None) -> bool:
    """Whether a failure with this match counts; no match is the default handling: it counts."""
    return match is None or match.counts


def evaluate(rules: Iterable[Any], failure: PodFailure) -> Match | None:
    """The first rule matching ``failure`` (as the Job controller decides), or ``None``.

    Like the controller, a rule is only a match when its action is one the controller
    acts on: a matching rule with an unknown action is passed over, and evaluation goes
    on with the next rule (the API reference: "Clients should react to an unknown action
    by skipping the rule"). ``onExitCodes`` is looked at first; ``onPodConditions`` only
    when a rule has no ``onExitCodes``.
    """
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict) or rule.get("action") not in ACTIONS:
            continue
        codes = rule.get("onExitCodes")
        if codes is not None:
            container = _match_codes(codes, failure) if isinstance(codes, dict) else None
            if container is not None:
                return Match(index, str(rule["action"]), rule, container=container)
            continue
        conditions = rule.get("onPodConditions")
        if isinstance(conditions, list):
            condition = _match_conditions(conditions, failure)
            if condition is not None:
                return Match(index, str(rule["action"]), rule, condition=condition)
    return None


def _match_codes(codes: Mapping[str, Any], failure: PodFailure) -> ContainerExit | None:
    listed = codes.get("values")
    if not _int_list(listed):
        # Not a list of exit codes (only a file can say so: the API server refuses it,
        # and ``validate`` reports it): a rule that cannot be stored matches nothing.
        return None
    values = set(listed)
    name = codes.get("containerName")
    operator = codes.get("operator")
    # The controller looks at regular containers first, then init containers, each list
    # in its status order; a container that exited 0 never matches, whatever the operator.
    ordered = [e for e in failure.exits if not e.init] + [e for e in failure.exits if e.init]
    for exit_ in ordered:
        if exit_.exit_code == 0 or (name is not None and exit_.name != name):
            continue
        if (operator == "In" and exit_.exit_code in values) or (
            operator == "NotIn" and exit_.exit_code not in values
        ):
            return exit_
    return None


def _match_conditions(patterns: list[Any], failure: PodFailure) -> str | None:
    """The first of the pod's conditions (in status order) that some pattern matches."""
    wanted = {
        (str(p.get("type")), str(p.get("status") or "True"))
        for p in patterns
        if isinstance(p, dict)
    }
    for condition in failure.conditions:
        if condition in wanted:
            return condition[0]
    return None


def judged_failed(pod: Mapping[str, Any], job_spec: Mapping[str, Any]) -> bool:
    """Whether the Job controller takes ``pod`` for failed now, and so judges it with its
    rules, reading its conditions as they are (``isPodFailed`` in
    pkg/controller/job/job_controller.go): a ``Failed`` pod; and a pod being deleted
    (``deletionTimestamp``) that has not succeeded, unless only failed pods are replaced
    (``onlyReplaceFailedPods``: a podFailurePolicy, or ``podReplacementPolicy: Failed``).
    So with a podFailurePolicy, which every Job our rules are in has, a condition added to
    a terminating pod before it is ``Failed`` is read when the pod is judged."""
    status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    phase = status.get("phase")
    if phase == "Failed":
        return True
    only_failed = job_spec.get("podFailurePolicy") is not None or (
        job_spec.get("podReplacementPolicy") == "Failed"
    )
    if only_failed:
        return False
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    return meta.get("deletionTimestamp") is not None and phase != "Succeeded"


# --- the failed pods a policy must be judged against -------------------------------


def _failed_conditions(init_failed: bool, disrupted: bool) -> tuple[tuple[str, str], ...]:
    """The conditions the kubelet leaves on a failed pod (Initialized is False when an
    init container failed): a rule may match them as well as an exit code."""
    conditions = (
        ("PodScheduled", "True"),
        ("Initialized", "False" if init_failed else "True"),
        ("Ready", "False"),
        ("ContainersReady", "False"),
    )
    return ((DISRUPTION_TARGET, "True"), *conditions) if disrupted else conditions


def app_failures(
    pod_spec: Mapping[str, Any], codes: Iterable[int]
) -> Iterator[tuple[ContainerExit, PodFailure]]:
    """For each application container and each code: the failed pod in which that
    container exited with that code and every other container with 0 (which no rule
    matches). The controller judges each pod on its own (``matchPodFailurePolicy``), so
    a policy must hold for each of these, one at a time."""
    init = set(app_containers(pod_spec)) - {
        c["name"] for c in named_containers(pod_spec, "containers")
    }
    for name in app_containers(pod_spec):
        for code in codes:
            exit_ = ContainerExit(name, code, name in init)
            yield exit_, PodFailure((exit_,), _failed_conditions(exit_.init, False))


#: Exit codes of a container stopped by a disruption: SIGTERM, or SIGKILL once the
#: grace period is over.
DISRUPTION_EXIT_CODES = (143, 137)
#: Up to this many running containers, every combination of their codes is tried.
_ALL_COMBINATIONS_UP_TO = 6


def disrupted_pods(pod_spec: Mapping[str, Any]) -> Iterator[PodFailure]:
    """Pods as preemption, eviction, drains and kubelet node-pressure evictions leave
    them: ``DisruptionTarget=True``, and every running container (the regular ones and
    the native sidecars) stopped with 143 or 137, in every combination (with more than
    six, each container's 137 against the others' 143 and the reverse); a pod disrupted
    during its init containers has only that init container stopped."""
    running = [c["name"] for c in named_containers(pod_spec, "containers")]
    running += sidecar_containers(pod_spec)
    if len(running) <= _ALL_COMBINATIONS_UP_TO:
        assignments: list[tuple[int, ...]] = [()]
        for _ in running:
            assignments = [(*a, code) for a in assignments for code in DISRUPTION_EXIT_CODES]
    else:
        term, kill = DISRUPTION_EXIT_CODES
        assignments = [(term,) * len(running), (kill,) * len(running)]
        for i in range(len(running)):
            for one, rest in ((kill, term), (term, kill)):
                assignments.append(tuple(one if j == i else rest for j in range(len(running))))
    sidecars = set(sidecar_containers(pod_spec))
    conditions = _failed_conditions(False, True)
    for codes in assignments:
        exits = tuple(
            ContainerExit(name, code, name in sidecars)
            for name, code in zip(running, codes, strict=True)
        )
        yield PodFailure(exits, conditions)
    regular_init = set(app_containers(pod_spec)) - set(running)
    for name in app_containers(pod_spec):
        if name in regular_init:
            for code in DISRUPTION_EXIT_CODES:
                exits = (ContainerExit(name, code, True),)
                yield PodFailure(exits, _failed_conditions(True, True))
