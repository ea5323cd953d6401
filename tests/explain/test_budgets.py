"""``explain`` and ``--simulate`` for budgets per cause: the rules in words, the budget of
restarts in place, and simulations that count disruptions, mark peers and replace pods as
the controller does (``webhook.controller.disruptions``, ``webhook.controller.restarts``)."""

from __future__ import annotations

import pytest

from testkit.builders import P
from testkit.explain import manifest
from webhook import cli, explain
from webhook.cluster.version import GivenVersion
from webhook.kube.versions import KubeVersion
from webhook.plan.simulation import ExplainError, parse_events
from webhook.policy.config import Config

V136 = GivenVersion(KubeVersion(1, 36))


def explained_all(obj: dict, events: str) -> list:
    prepared, _ = cli.prepare(obj, None)
    found = explain.explain(prepared, Config(), None, parse_events(events), version=V136)
    assert isinstance(found, list), found
    return found


def explained(annotations: dict, events: str, **spec):
    (item,) = explained_all(manifest(annotations, spec=spec or None), events)
    return item


def test_simulate_three_disruptions_with_max_disruptions_2():
    item = explained(
        {P + "ignore-disruptions": "true", P + "max-disruptions": "2", P + "backoff-limit": "0"},
        "disruption,disruption,disruption",
    )
    steps = item.simulation.steps
    assert [(s.action, s.counted) for s in steps] == [
        ("Ignore", False),
        ("Ignore", False),
        ("Count", True),
    ]
    assert steps[0].result.startswith("disruption 1 of 2 free, rule 2 (Ignore)")
    assert steps[2].result.startswith("disruption 3, over max-disruptions 2, rule 1 (Count)")
    assert item.simulation.ending.reason == "BackoffLimitExceeded"
    assert any(n.startswith("max-disruptions 2: the first 2 disruptions") for n in item.notes)
    rule = item.rules[0]
    assert "max-disruptions were used" in rule.when
    assert rule.origin == "added by retry-policy for max-disruptions"


def test_an_indexed_jobs_disruptions_are_counted_per_index_in_words():
    item = explained(
        {P + "ignore-disruptions": "true", P + "max-disruptions": "1"},
        "disruption,disruption",
        completionMode="Indexed",
        completions=4,
        parallelism=4,
        backoffLimitPerIndex=1,
    )
    assert any("the first disruption of each index is free" in n for n in item.notes), item.notes
    assert [s.action for s in item.simulation.steps] == ["Ignore", "Count"]


def test_simulate_a_peer_of_a_disrupted_pod():
    """Without peer-disruptions, a peer's exit 1 is a non-retriable exit (FailJob); with
    it, the controller's mark decides first."""
    base = {P + "fail-non-retriable": "true", P + "ignore-disruptions": "true"}
    without = explained(base, "disruption,peer", parallelism=4, completions=4)
    assert [s.action for s in without.simulation.steps] == ["Ignore", "FailJob"]
    assert without.simulation.steps[1].what == "a peer of a disrupted pod fails (main exits 1)"
    marked = explained(
        {**base, P + "peer-disruptions": "count"}, "disruption,peer", parallelism=4, completions=4
    )
    assert [(s.action, s.counted) for s in marked.simulation.steps] == [
        ("Ignore", False),
        ("Count", True),
    ]
    assert any(n.startswith("peer-disruptions count:") for n in marked.notes)


def test_simulate_restarts_in_place_replaced_at_the_budget():
    """Five 42s restart in place; the fifth reaches max-in-place-restarts 5, and the
    controller's replacement is counted (rule 1); with backoffLimit 1 the second pod's
    replacement ends the Job: 5 x (1 + 1) restarts in place, as the bound says."""
    annotations = {
        P + "in-place-exit-codes": "42",
        P + "max-in-place-restarts": "5",
        P + "backoff-limit": "1",
    }
    item = explained(annotations, ",".join(["42"] * 11))
    steps = item.simulation.steps
    assert [s.pod for s in steps] == [1] * 5 + [2] * 5
    assert [s.replaced for s in steps] == ([False] * 4 + [True]) * 2
    assert steps[4].action == "Count" and steps[4].counted
    assert "restart 5 of max-in-place-restarts 5 in this pod: the controller replaces" in (
        steps[4].result
    )
    assert item.simulation.ending.reason == "BackoffLimitExceeded"
    assert item.simulation.unused == ["42"]
    assert item.in_place.bounded
    assert "5 x (backoffLimit 1 + 1) = 10 restarts in place at most" in item.in_place.bound


def test_a_jobsets_disruption_budget_is_the_sets_across_restarts():
    from testkit.kinds import jobset

    obj = jobset(
        {P + "ignore-disruptions": "true", P + "max-disruptions": "1", P + "backoff-limit": "2"}
    )
    items = explained_all(obj, "disruption,disruption,disruption")
    workers = items[-1]
    assert [s.action for s in workers.simulation.steps] == ["Ignore", "Count", "Count"]
    assert [s.run for s in workers.simulation.steps] == [1, 1, 2]  # the count outlives run 1


@pytest.mark.parametrize("events", ["peer+disruption", "peer+peer", "disruption+disruption"])
def test_a_pod_is_disrupted_or_a_peer_once(events):
    with pytest.raises(ExplainError, match=r"accepted: .*peer"):
        parse_events(events)
