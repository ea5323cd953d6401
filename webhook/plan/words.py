"""Settings, podFailurePolicy rules and placement, in words."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from webhook.kube import failurepolicy
from webhook.kube.objects import items
from webhook.plan import inplace
from webhook.plan.explained import (
    MAX_ATTEMPT_ROWS,
    AttemptGap,
    AttemptRow,
    AttemptTable,
    RuleLine,
    SettingLine,
)
from webhook.plan.model import first_non_spot, non_spot
from webhook.plan.record import rule_id
from webhook.policy.grammar import format_duration
from webhook.policy.model import PREFIX, Delays, Policy, Setting, Source, format_value

# --- settings and their provenance -------------------------------------------------------


def setting_lines(
    policy: Policy, names: Iterable[str], default: str = Source.KUBERNETES.value
) -> list[SettingLine]:
    """One line per setting; ``default`` names the API whose default a value is when it
    came from no one (a RayJob's ``backoffLimit`` is its CRD's default, not Kubernetes')."""
    lines = []
    for name in names:
        setting = policy.setting(name)
        lines.append(
            SettingLine(
                name=name,
                value=_value_text(name, setting.value),
                source=setting.source.value,
                detail=setting.detail,
                text=source_text(name, setting, default=default),
            )
        )
    return lines


def _value_text(name: str, value: Any) -> str:
    if value is None and name != "error-propagation":
        return "-"
    if name == "retriable-exit-codes":
        return ",".join(ranges(value))
    return format_value(name, value)


def ranges(values: Iterable[Any]) -> list[str]:
    """Exit codes with runs of three or more folded: [1, 2, 3, 42] -> ["1-3", "42"]."""
    codes = sorted({v for v in values if isinstance(v, int)})
    out: list[str] = []
    start = previous = None
    for code in [*codes, None]:
        if start is not None and code is not None and code == previous + 1:
            previous = code
            continue
        if start is not None and previous - start >= 2:
            out.append(f"{start}-{previous}")
        elif start is not None:
            out.extend(str(c) for c in range(start, previous + 1))
        start = previous = code
    return out


def source_text(
    name: str, setting: Setting, long: bool = False, default: str = Source.KUBERNETES.value
) -> str:
    """Where a value came from, in words; ``long`` names the annotation key too."""
    detail = setting.detail.strip("()")
    if setting.source is Source.ANNOTATION:
        return f"your annotation {PREFIX}{name}" if long else "your annotation"
    if setting.source is Source.SPEC:
        return f"your own {detail}" if detail else "your own spec"
    if setting.source is Source.NAMESPACE:
        return f"namespace default for {detail}" if detail else "namespace default"
    if setting.source is Source.CLUSTER and detail:
        return f"cluster guard rail {detail}" if "guardRails" in detail else "cluster default"
    if setting.source is Source.BUILTIN:
        # The retriable codes have a value even when nobody set them (143, SIGTERM).
        return "built-in default" if name == "retriable-exit-codes" else "not set"
    if setting.source is Source.KUBERNETES:
        return f"the {default}" if long else default
    return setting.source.value


# --- podFailurePolicy rules in words -----------------------------------------------------


def join_words(values: Sequence[Any], word: str = "or", limit: int = 8) -> str:
    items = [str(v) for v in values]
    if len(items) > limit:
        return ", ".join(items[:limit]) + f" {word} {len(items) - limit} more"
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + f" {word} {items[-1]}"


def describe_when(rule: Mapping[str, Any]) -> str:
    """The condition of one rule, as a phrase: "exit code 42 in container main"."""
    codes = rule.get("onExitCodes")
    if isinstance(codes, dict):
        values = ranges(items(codes.get("values")))
        where = (
            f"in container {codes['containerName']}"
            if codes.get("containerName")
            else "in any container"
        )
        plural = "s" if len(values) > 1 or "-" in "".join(values) else ""
        if codes.get("operator") == "NotIn":
            return f"a non-zero exit code other than {join_words(values)} {where}"
        if codes.get("operator") == "In":
            return f"exit code{plural} {join_words(values)} {where}"
        return f"exit codes with operator {codes.get('operator')!r} (never matches)"
    conditions = rule.get("onPodConditions")
    if isinstance(conditions, list):
        phrases = []
        for pattern in conditions:
            if not isinstance(pattern, dict):
                continue
            kind, status = str(pattern.get("type")), str(pattern.get("status") or "True")
            if kind == failurepolicy.DISRUPTION_TARGET and status == "True":
                phrases.append(
                    "the pod was disrupted (preemption, eviction, node drain, or the kubelet's "
                    "node-pressure eviction)"
                )
            elif kind in OUR_CONDITION_WORDS and status == "True":
                phrases.append(OUR_CONDITION_WORDS[kind])
            elif status == "True":
                phrases.append(f"the pod has condition {kind}")
            else:
                phrases.append(f"the pod's condition {kind} is {status}")
        return join_words(phrases) if phrases else "no condition (never matches)"
    return "nothing (the rule has neither onExitCodes nor onPodConditions)"


#: The conditions the webhook's controller adds (``webhook.plan.causes``), in words.
OUR_CONDITION_WORDS = {
    failurepolicy.DISRUPTION_BUDGET_EXHAUSTED: (
        "the pod was disrupted after max-disruptions were used (the controller marks it "
        f"{failurepolicy.DISRUPTION_BUDGET_EXHAUSTED})"
    ),
    failurepolicy.IN_PLACE_BUDGET_EXHAUSTED: (
        "the controller replaced the pod after max-in-place-restarts restarts in place "
        f"({failurepolicy.IN_PLACE_BUDGET_EXHAUSTED})"
    ),
    failurepolicy.PEER_DISRUPTED: (
        "a peer of the pod was disrupted while it ran (the controller marks it "
        f"{failurepolicy.PEER_DISRUPTED})"
    ),
}
#: The key that adds each rule on a condition of ours.
OUR_CONDITION_KEYS = {
    failurepolicy.DISRUPTION_BUDGET_EXHAUSTED: "max-disruptions",
    failurepolicy.IN_PLACE_BUDGET_EXHAUSTED: "max-in-place-restarts",
    failurepolicy.PEER_DISRUPTED: "peer-disruptions",
}


def describe_then(action: str, limit_name: str = "backoffLimit") -> str:
    return {
        "FailJob": "the Job fails at once",
        "FailIndex": "its index fails at once and is not retried",
        "Ignore": "retried, does not count",
        "Count": f"retried, counts against {limit_name}",
    }.get(action, f"skipped: Kubernetes does not know the action {action!r}")


def rule_lines(
    rules: Sequence[Any],
    user_rules: Sequence[Any],
    policy: Policy,
    limit_name: str,
    origins: Mapping[str, str] | None = None,
) -> list[RuleLine]:
    """Every rule of the final spec, with who wrote it: the user, or this webhook for the
    annotation its applied record names (``origins``, by rule id)."""
    lines = []
    for number, rule in enumerate(rules, 1):
        if not isinstance(rule, dict):
            continue
        if origins is None:
            origin = _origin_by_shape(rule, user_rules, policy)
        else:
            name = origins.get(rule_id(rule))
            origin = f"added by retry-policy for {name}" if name else "your rule"
        action = str(rule.get("action"))
        known = action in failurepolicy.ACTIONS
        lines.append(
            RuleLine(
                number=number,
                action=action,
                when=describe_when(rule),
                then=describe_then(action, limit_name),
                origin=origin,
                counts=(action != "Ignore") if known else None,
            )
        )
    return lines


def _origin_by_shape(rule: Mapping[str, Any], user_rules: Sequence[Any], policy: Policy) -> str:
    """Who wrote ``rule``, recognised by its shape: only for objects whose applied record
    is version 1 (written before records named the annotation behind each rule), or that
    have none."""
    key = failurepolicy.rule_key(rule)
    if key in {failurepolicy.rule_key(r) for r in user_rules}:
        return "your rule"
    if key == failurepolicy.rule_key(failurepolicy.ignore_disruptions_rule()):
        return "added by retry-policy for ignore-disruptions"
    if failurepolicy.on_our_conditions(rule):
        kind = rule["onPodConditions"][0]["type"]
        return f"added by retry-policy for {OUR_CONDITION_KEYS.get(kind, 'a budget')}"
    if key == failurepolicy.rule_key(failurepolicy.count_disruptions_rule()) or any(
        failurepolicy.is_non_retriable_rule(rule, codes) for codes in inplace.recognised(policy)
    ):
        return "added by retry-policy for fail-non-retriable"
    return "added by retry-policy"


# --- placement -------------------------------------------------------------------------


def nodes_text(non_spot: bool) -> str:
    return "non-spot only" if non_spot else "any node"


def count_of(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def on_nodes(nodes: str) -> str:
    return "on non-spot nodes only" if nodes == nodes_text(True) else "on any node"


def _retries(n: int) -> str:
    return f"{n} retr{'y' if n == 1 else 'ies'} left"


def attempt_table(
    limit_field: str,
    limit: int,
    placement_limit: int | None,
    non_spot_attempts: int,
    final: str,
    unit: str = "attempt",
    delays: Delays | None = None,
) -> AttemptTable:
    """One row per attempt ``a`` = 0..limit (counted failures before it); long tables keep
    their first and last rows and the rows around the non-spot boundary. With ``unit``
    "run" a row is one run of a JobSet and ``a`` the restarts before it. ``delays``: what
    each attempt waits after the failure before it (``retry-delay``)."""
    keep = set(range(min(3, limit + 1))) | set(range(max(0, limit - 2), limit + 1))
    if non_spot_attempts > 0 and placement_limit is not None:
        boundary = first_non_spot(placement_limit, non_spot_attempts)
        keep |= {a for a in (boundary - 1, boundary) if 0 <= a <= limit}
    if limit + 1 <= MAX_ATTEMPT_ROWS:
        keep = set(range(limit + 1))
    rows: list[AttemptRow | AttemptGap] = []
    previous = -1
    for a in sorted(keep):
        if a > previous + 1:
            rows.append(AttemptGap(previous + 2, a))
        left = limit - a
        rows.append(
            AttemptRow(
                attempt=a + 1,
                failures_before=a,
                nodes=nodes_text(non_spot(a, placement_limit, non_spot_attempts)),
                if_fails=_again(unit, left) if left else final,
                retries_left=left or None,
                waits=(format_duration(delays.seconds(a)) if a else "-") if delays else "",
            )
        )
        previous = a
    return AttemptTable(limit_field, limit, non_spot_attempts, rows, unit, delays is not None)


def _again(unit: str, left: int) -> str:
    if unit == "run":
        return f"the set restarts, {left} restart{'' if left == 1 else 's'} left"
    return f"retried, {_retries(left)}"
