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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from webhook.problems import Problem

ACTIONS = ("FailJob", "FailIndex", "Ignore", "Count")
MAX_RULES = 20
MAX_EXIT_CODE_VALUES = 255
MAX_POD_CONDITION_PATTERNS = 20
CONDITION_STATUSES = ("True", "False", "Unknown")
DISRUPTION_TARGET = "DisruptionTarget"


def non_retriable_rule(retriable: Iterable[int], action: str = "FailJob") -> dict[str, Any]:
    """Fail (the Job, or the index) on any exit code outside the retriable set."""
    return {
        "action": action,
        "onExitCodes": {"operator": "NotIn", "values": sorted(set(retriable))},
    }


def ignore_disruptions_rule() -> dict[str, Any]:
    """Preemption, eviction and drains mark the pod ``DisruptionTarget=True``: do not count."""
    return {
        "action": "Ignore",
        "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}],
    }


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
        codes_key = (
            _scalar(codes.get("containerName")),
            _scalar(codes.get("operator")),
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
    return (_scalar(rule.get("action")), codes_key, conditions_key)


def _scalar(value: Any) -> Any:
    """``value`` if hashable as it is, else its repr (a malformed rule's list or mapping)."""
    return value if value is None or isinstance(value, (str, int, float)) else repr(value)


def _int_list(values: Any) -> TypeGuard[list[int]]:
    return isinstance(values, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    )


def merge(user_rules: list[Any], ours: list[dict[str, Any]]) -> tuple[list[Any], list[dict]]:
    """The user's rules first (their order is their intent), then ours not already there.

    ``ours`` are fresh dicts built for this request; they are placed as they are.
    """
    merged = list(user_rules)
    present = {rule_key(rule) for rule in user_rules}
    added = []
    for rule in ours:
        key = rule_key(rule)
        if key not in present:
            merged.append(rule)
            present.add(key)
            added.append(rule)
    return merged, added


def container_names(pod_spec: Mapping[str, Any]) -> set[str]:
    names = set()
    for group in ("initContainers", "containers"):
        items = pod_spec.get(group)
        for container in items if isinstance(items, list) else ():
            if isinstance(container, dict) and isinstance(container.get("name"), str):
                names.add(container["name"])
    return names


def validate(job_spec: Mapping[str, Any], where: str = "spec") -> list[Problem]:
    """Every API-server rule for ``podFailurePolicy`` (FACTS.md), as problems.

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
    if rules and restart != "Never":
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
