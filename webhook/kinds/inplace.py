"""In-place retries written into a pod spec: each regular container's restart rule (and
``restartPolicy: Never``), and the admin's default deadline that bounds them. What is
checked first, and the rule itself, are planned in ``webhook.plan.inplace``."""

from __future__ import annotations

from typing import Any

from webhook.kube import failurepolicy as fp
from webhook.kube.objects import items
from webhook.plan.inplace import NODES_NOTE, rule, takes_rule
from webhook.plan.outcome import Outcome
from webhook.policy.model import Policy, format_value


def apply(pod_spec: dict[str, Any], policy: Policy, out: Outcome, where: str) -> None:
    """Give each regular container of ``pod_spec`` the restart rule, after its own; one
    with its own restartPolicy OnFailure or Always is left as it is (``takes_rule``).
    ``where`` is the pod template's path ("" for a Pod's own spec)."""
    codes = policy.in_place_exit_codes
    if not codes:
        return
    label = where or "spec"
    wanted = rule(policy)
    changed, taking = [], []
    for container in fp.named_containers(pod_spec, "containers"):
        own = items(container.get("restartPolicyRules"))
        name = container["name"]
        if not takes_rule(container):
            kept = container.get("restartPolicy")
            when = "any non-zero exit" if kept == "OnFailure" else "every exit, success too"
            _note_once(
                out,
                f"retry-policy: {label}: container {name} keeps its restartPolicy {kept}, "
                f"which restarts it in place on {when}",
            )
            continue
        taking.append(name)
        out.wrote(wanted, "in-place-exit-codes", wanted not in own)
        if wanted in own and container.get("restartPolicy") == "Never":
            continue
        container["restartPolicy"] = "Never"
        if wanted not in own:
            container["restartPolicyRules"] = [*own, rule(policy)]
        changed.append(name)
    if taking and policy.in_place_scope == "pod":
        _note_once(out, NODES_NOTE)
    if not changed:
        return
    out.actions["in_place_rules"] = out.actions.get("in_place_rules", 0) + len(changed)
    names = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    noun = "container" if len(changed) == 1 else "containers"
    text = format_value("in-place-exit-codes", codes)
    if policy.in_place_scope == "pod":
        out.changed(
            f"retry-policy: {label}: the whole pod restarts in place when {noun} {names} "
            f"exits {text} (in-place-scope pod)",
            policy.setting("in-place-exit-codes"),
        )
    else:
        out.changed(
            f"retry-policy: {label}: {noun} {names} restarts in place on exit {text} "
            "(in-place-exit-codes)",
            policy.setting("in-place-exit-codes"),
        )


def _note_once(out: Outcome, text: str) -> None:
    """A JobSet's replicated Jobs would each say it."""
    if text not in out.notes:
        out.note(text)


def write_deadline(
    target: dict[str, Any], field: str, seconds: int, label: str, out: Outcome
) -> None:
    """The admin's default deadline, written where nothing bounds in-place restarts."""
    if target.get(field) == seconds:
        return
    target[field] = seconds
    out.changed(
        f"retry-policy: {label} -> {seconds} (guardRails.inPlaceDeadlineSeconds: "
        "bounds the in-place restarts)"
    )
