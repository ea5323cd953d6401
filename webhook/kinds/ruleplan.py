"""The podFailurePolicy rules a policy writes into one JobSpec: ours (``our_rules``), merged
with the user's (``failurepolicy.merge``), said in warnings (``describe_ours``) and
validated as the API server will (``failurepolicy.validate``).

What that comes to is remembered (``write_rules``): it depends only on the settings that
make rules, the pod template's containers, the spec's own rules and the few fields the
validation reads (``_rules_key``), which the Jobs of one template share however their
budgets differ. A Job never seen before, with a budget of its own (the worst case for the
verdict memo, ``webhook.admission.memo``), then costs the rules no merge and no validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.kube import failurepolicy as fp
from webhook.kube.objects import mapping
from webhook.plan import causes, failureaware
from webhook.plan.outcome import Outcome
from webhook.policy.model import Policy
from webhook.problems import Problem

#: How every warning of ``unbounded_note`` ends (a TrainJob says its own in place of its
#: JobSet's).
UNBOUNDED = ": ignored disruptions retry with no cap"


PEERS_UNBOUNDED = ": ignored peers retry with no cap"
FREE_UNBOUNDED = " (or max-free-failures): free failures (free-categories) retry with no cap"


def unbounded_note(field: str, ending: str = UNBOUNDED) -> str:
    """The warning when our Ignore rule goes into a Job without a deadline: ignored
    failures never use up backoffLimit, so a Job preempted again and again would never
    end (``max-disruptions`` caps the disruptions themselves, not their peers); ``field``
    is the deadline that would end it. (Said with the rule, so a reinvocation that adds
    nothing stays silent.)"""
    return f"retry-policy: set {field}{ending}"


def our_rules(policy: Policy, pod_spec: Mapping[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The podFailurePolicy rules ``policy`` adds to a JobSpec with this pod template, each
    with the setting that adds it, in their order: a rule on DisruptionTarget first (a
    preempted pod may exit 137 after its grace period, or 1 if the application says so
    on SIGTERM, and must be decided before an exit-code rule could fail the Job for it:
    ``matchPodFailurePolicy`` stops at the first match): Ignore for ignore-disruptions,
    else Count for fail-non-retriable (``Policy.count_disruptions``); then one exit-code
    rule per application container (a regular container's retries the in-place codes
    too: ``inplace.retriable``). The rules on the conditions our controller adds
    (``causes.rules``) come first of all (``fp.merge`` puts them before the user's too)."""
    ours = causes.rules(policy)
    if policy.ignore_disruptions:
        ours.append((fp.ignore_disruptions_rule(), "ignore-disruptions"))
    if policy.count_disruptions:
        ours.append((fp.count_disruptions_rule(), "fail-non-retriable"))
    if policy.fail_non_retriable:
        action = "FailIndex" if policy.on_non_retriable == "fail-index" else "FailJob"
        retried, restarting = policy.retriable_exit_codes, policy.in_place_exit_codes
        for rule in fp.non_retriable_rules(pod_spec, retried, action, restarting):
            ours.append((rule, "fail-non-retriable"))
    return ours


def describe_ours(rules: list[dict[str, Any]]) -> str:
    """Our added rules, for a warning: "rule Ignore on DisruptionTarget", "rule Count on
    DisruptionTarget", "rule FailJob on exit codes NotIn [143] in main", "rules ... in a,
    b" (the containers whose codes they read)."""
    codes = rules[0].get("onExitCodes")
    if not isinstance(codes, dict):
        patterns = [mapping(p) for p in rules[0].get("onPodConditions") or [{}]]
        types = ", ".join(str(p.get("type", fp.DISRUPTION_TARGET)) for p in patterns)
        return f"rule {rules[0]['action']} on {types}"
    plural = "s" if len(rules) > 1 else ""
    text = f"rule{plural} {rules[0]['action']} on exit codes NotIn {codes['values']}"
    names = [str(mapping(r.get("onExitCodes")).get("containerName")) for r in rules]
    if "containerName" in codes:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        text += f" in {shown}"
    return text


def _rules(spec: Mapping[str, Any]) -> list[Any]:
    policy = spec.get("podFailurePolicy")
    if isinstance(policy, dict) and isinstance(policy.get("rules"), list):
        return list(policy["rules"])
    return []


@dataclass(frozen=True)
class _RememberedRules:
    """What ``write_rules`` comes to for one key (``_rules_key``)."""

    #: Our rules (JSON: each object gets rules of its own) and the setting adding each.
    ours: bytes
    names: tuple[str, ...]
    #: Whether each of ours is added (else the spec has it already).
    added: tuple[bool, ...]
    #: The rules written, each (ours?, its index in ours or in the spec's own rules);
    #: ``None``: none of ours added, the spec's rules left as they are.
    merged: tuple[tuple[bool, int], ...] | None
    #: (setting, action, warning) of each group of ours added, in order.
    said: tuple[tuple[str, str, str], ...]
    #: ``failurepolicy.validate`` of the spec as written.
    problems: tuple[Problem, ...]


#: Plans by key; bounded, cleared when full (a cluster admits a few templates).
_REMEMBERED: dict[tuple, _RememberedRules] = {}
_REMEMBERED_MAX = 1024


def _rules_key(
    spec: Mapping[str, Any], pod_spec: Mapping[str, Any], policy: Policy, where: str
) -> tuple | None:
    """Everything ``write_rules`` reads but its warnings' settings, the deadline its notes
    ask about and the OOM note (read anew each time): the settings ``our_rules`` reads, the
    containers (names; an init container's, and whether it is a sidecar), the spec's
    podFailurePolicy as JSON, and the fields the validation reads. ``None``: a
    podFailurePolicy that is not JSON, run without remembering (as is a key that holds a
    field of an unexpected type, which the lookup cannot hash: ``write_rules``)."""
    try:
        pfp = orjson.dumps(spec.get("podFailurePolicy"))
    except (TypeError, orjson.JSONEncodeError):
        return None
    key = (
        policy.max_in_place_restarts,
        policy.in_place_exit_codes,
        policy.max_disruptions,
        policy.ignore_disruptions,
        policy.peer_disruptions,
        policy.count_disruptions,
        policy.fail_non_retriable,
        policy.on_non_retriable,
        policy.retriable_exit_codes,
        policy.free_categories,
        policy.fail_categories,
        policy.max_free_failures,
        tuple([c["name"] for c in fp.named_containers(pod_spec, "containers")]),
        tuple(
            [(c["name"], fp.is_sidecar(c)) for c in fp.named_containers(pod_spec, "initContainers")]
        ),
        pod_spec.get("restartPolicy"),
        spec.get("podReplacementPolicy"),
        spec.get("backoffLimitPerIndex") is None,
        pfp,
        where,
    )
    return key


def write_rules(
    spec: dict[str, Any], pod_spec: dict[str, Any], policy: Policy, out: Outcome, where: str
) -> None:
    """Our rules into ``spec`` (a JobSpec whose pod template spec is ``pod_spec``), said in
    ``out`` (each rule, the changes, the problems the API server would find)."""
    key = _rules_key(spec, pod_spec, policy, where)
    try:
        remembered = _REMEMBERED.get(key) if key is not None else None
    except TypeError:  # (a value the key holds cannot be hashed: run without remembering)
        key, remembered = None, None
    if remembered is None:
        remembered = _write(spec, pod_spec, policy, out, where)
        if key is not None and remembered is not None:
            if len(_REMEMBERED) >= _REMEMBERED_MAX:
                _REMEMBERED.clear()
            _REMEMBERED[key] = remembered
        return
    if not remembered.names:
        return
    rules = orjson.loads(remembered.ours)
    for rule, name, added in zip(rules, remembered.names, remembered.added, strict=True):
        out.wrote(rule, name, added)
    if remembered.merged is not None:
        theirs = _rules(spec)
        merged = [rules[i] if mine else theirs[i] for mine, i in remembered.merged]
        _said(
            spec,
            merged,
            policy,
            out,
            where,
            [(n, a) for n, a, _ in remembered.said],
            remembered.said,
        )
    out.problems.extend(remembered.problems)


def _write(
    spec: dict[str, Any], pod_spec: dict[str, Any], policy: Policy, out: Outcome, where: str
) -> _RememberedRules | None:
    """``write_rules`` worked out, and what it came to (``None``: not to be remembered)."""
    ours = our_rules(policy, pod_spec)
    if not ours:
        return _RememberedRules(b"[]", (), (), None, (), ())
    theirs = _rules(spec)
    merged, added = fp.merge(theirs, [rule for rule, _ in ours])
    added_ids = {id(r) for r in added}  # merge places our rule objects as they are
    for rule, name in ours:
        out.wrote(rule, name, id(rule) in added_ids)
    said: tuple[tuple[str, str, str], ...] = ()
    order = None
    if added:
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for rule, name in ours:
            if id(rule) in added_ids:
                groups.setdefault((name, str(rule["action"])), []).append(rule)
        said = tuple(
            (name, action, describe_ours(rules)) for (name, action), rules in groups.items()
        )
        position = {id(rule): (True, i) for i, (rule, _) in enumerate(ours)}
        for i, rule in enumerate(theirs):
            position.setdefault(id(rule), (False, i))
        order = tuple(position[id(rule)] for rule in merged)
        _said(spec, merged, policy, out, where, list(groups), said)
    problems = fp.validate(spec, where)
    out.problems.extend(problems)
    try:
        text = orjson.dumps([rule for rule, _ in ours])
    except (TypeError, orjson.JSONEncodeError):
        return None
    added_flags = tuple(id(rule) in added_ids for rule, _ in ours)
    names = tuple(name for _, name in ours)
    return _RememberedRules(text, names, added_flags, order, said, tuple(problems))


def _said(
    spec: dict[str, Any],
    merged: list[Any],
    policy: Policy,
    out: Outcome,
    where: str,
    groups: list[tuple[str, str]],
    said: tuple[tuple[str, str, str], ...],
) -> None:
    """The rules written (some of ours were added), and said."""
    pfp = spec.get("podFailurePolicy")
    if not isinstance(pfp, dict):
        pfp = spec["podFailurePolicy"] = {}
    pfp["rules"] = merged
    for name, action, text in said:
        # Our Count rule on DisruptionTarget is not required of an object
        # (``engine._unapplied``): one mutated by a replica that did not add it yet
        # stays valid in an upgrade.
        counted = action == "Count" and name == "fail-non-retriable"
        setting = None if counted else policy.setting(name)
        out.changed(f"retry-policy: added podFailurePolicy {text} ({name})", setting)
    if any(name == "fail-non-retriable" for name, _ in groups):
        failureaware.check_oom_signal(policy, out)  # said with the rule, as below
    ignored = ("ignore-disruptions", "Ignore") in groups and policy.max_disruptions is None
    if ignored and spec.get("activeDeadlineSeconds") is None:
        out.note(unbounded_note(f"{where}.activeDeadlineSeconds"))
    if ("peer-disruptions", "Ignore") in groups and spec.get("activeDeadlineSeconds") is None:
        out.note(unbounded_note(f"{where}.activeDeadlineSeconds", PEERS_UNBOUNDED))
    free = ("free-categories", "Ignore") in groups and policy.max_free_failures is None
    if free and spec.get("activeDeadlineSeconds") is None:
        out.note(unbounded_note(f"{where}.activeDeadlineSeconds", FREE_UNBOUNDED))
    if spec.get("podReplacementPolicy") == "TerminatingOrFailed":
        spec["podReplacementPolicy"] = "Failed"
        out.changed(
            f"retry-policy: {where}.podReplacementPolicy -> Failed "
            "(required with a podFailurePolicy)"
        )
