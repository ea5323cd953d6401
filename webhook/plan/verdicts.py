"""Acting on why a pod failed: ``free-categories``, ``max-free-failures``,
``fail-categories`` and ``start-deadline`` (the categories: ``webhook.policy.categories``).

The controller writes a failed pod's category as the condition
``retry-policy.dev/<Category>`` (``webhook.controller.verdicts``) and admission writes the
rules that act on it, placed with the other rules on our conditions, before every rule of
the user's (``causes.rules``, ``failurepolicy.merge``), in this order:

1. ``Count`` on ``retry-policy.dev/FreeBudgetExhausted`` (``max-free-failures: N``): the
   controller adds it, with the category, to a free failure past the first N of the
   workload (per index with ``backoffLimitPerIndex``, per JobSet for a JobSet's pods), so
   it counts: before the Ignore rule below, as ``max-disruptions``' Count comes before
   ``ignore-disruptions``' Ignore;
2. ``FailJob`` (``FailIndex`` under ``on-non-retriable: fail-index``) on the
   ``fail-categories``' conditions, one rule with a pattern each (a rule's patterns match
   when any does: ``matchOnPodConditions``);
3. ``Ignore`` on the ``free-categories``' conditions, likewise.

A pod has one category, so the two lists may not share one. ``start-deadline`` needs no
rule: the controller ends a pod that has not started in time (``webhook.controller.
verdicts``), classified first, and its failure counts, unless its category is free or
fails the Job.

The pod template is labelled for the controller, as the budgets' are (``causes.labels``):
``retry-policy.dev/categories: "true"`` on the pods whose rules read a category (the
controller watches them from before they fail, to mark them in time),
``retry-policy.dev/max-free-failures: "N"`` and ``retry-policy.dev/start-deadline: "15m"``.
"""

from __future__ import annotations

from typing import Any

from webhook.kube import failurepolicy as fp
from webhook.plan.outcome import Context, Outcome
from webhook.policy import categories as cats
from webhook.policy.grammar import format_duration
from webhook.policy.model import PREFIX, Policy

CATEGORIES_LABEL = PREFIX + "categories"
MAX_FREE_LABEL = PREFIX + "max-free-failures"
START_DEADLINE_LABEL = PREFIX + "start-deadline"
#: The keys whose rules read a category (the pods are watched to be marked in time).
RULE_KEYS = ("free-categories", "fail-categories", "max-free-failures")
KEYS = (*RULE_KEYS, "start-deadline")


def fail_action(policy: Policy) -> str:
    return "FailIndex" if policy.on_non_retriable == "fail-index" else "FailJob"


def category_rule(names: tuple[str, ...], action: str) -> dict[str, Any]:
    """One rule on the conditions of ``names``."""
    patterns = [{"type": cats.condition_type(name), "status": "True"} for name in names]
    return {"action": action, "onPodConditions": patterns}


def rules(policy: Policy) -> list[tuple[dict[str, Any], str]]:
    """The rules on categories ``policy`` adds, each with the setting that adds it, in
    their order (see the module's doc)."""
    ours: list[tuple[dict[str, Any], str]] = []
    if policy.max_free_failures is not None and policy.free_categories:
        ours.append((fp.condition_rule(fp.FREE_BUDGET_EXHAUSTED), "max-free-failures"))
    if policy.fail_categories:
        rule = category_rule(policy.fail_categories, fail_action(policy))
        ours.append((rule, "fail-categories"))
    if policy.free_categories:
        ours.append((category_rule(policy.free_categories, "Ignore"), "free-categories"))
    return ours


def labels(policy: Policy) -> dict[str, str]:
    """The template labels for the controller, by key (without the prefix)."""
    wanted: dict[str, str] = {}
    if policy.free_categories or policy.fail_categories or policy.start_deadline is not None:
        wanted["categories"] = "true"
    if policy.max_free_failures is not None and policy.free_categories:
        wanted["max-free-failures"] = str(policy.max_free_failures)
    if policy.start_deadline is not None:
        wanted["start-deadline"] = format_duration(policy.start_deadline)
    return wanted


def check(policy: Policy, ctx: Context, out: Outcome) -> Policy:
    """Names that are no category are denied, listing the categories there are; a
    category both free and failing is denied; a list longer than a rule's patterns may be
    is denied (a default, each time, skipped)."""
    configured = ctx.config.categories
    for name in ("free-categories", "fail-categories"):
        wanted = policy.value(name) or ()
        if not wanted:
            continue  # (the usual case: nothing to check, no list of categories to make)
        unknown, known = cats.check_names(wanted, configured)
        if unknown:
            policy = out.refuse(
                policy,
                name,
                f"{', '.join(unknown)}: no such category; the categories are {known}",
                "unknown-category",
            )
        elif len(wanted) > fp.MAX_POD_CONDITION_PATTERNS:
            policy = out.refuse(
                policy,
                name,
                f"{len(wanted)} categories; a rule matches at most "
                f"{fp.MAX_POD_CONDITION_PATTERNS} conditions",
                "too-many-categories",
            )
    free, fail = policy.free_categories, policy.fail_categories
    both = sorted(set(free) & set(fail)) if free and fail else []
    if both:
        policy = out.refuse(
            policy,
            "fail-categories",
            f"{', '.join(both)} {'is' if len(both) == 1 else 'are'} also in free-categories: "
            "a failure is either free or fails the Job; name each category in one of them",
            "contradiction",
        )
    return policy
