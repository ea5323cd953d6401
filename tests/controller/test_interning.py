"""One copy of each distinct rule list the controller keeps (``webhook.controller.interning``)."""

from __future__ import annotations

import copy
import json

from webhook.controller import interning
from webhook.controller.interning import RuleSets

RULES = (
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [143]}},
)


def test_equal_rules_decoded_apart_are_kept_once_and_unequal_ones_apart():
    sets = RuleSets()
    first = sets.shared(tuple(json.loads(json.dumps(RULES))))
    again = sets.shared(tuple(json.loads(json.dumps(RULES))))
    assert again is first and again == RULES
    other = tuple(copy.deepcopy(RULES[:1]))
    assert sets.shared(other) is other and len(sets) == 2
    assert sets.shared(()) == () and len(sets) == 2


def test_the_table_is_bounded_and_starts_again_past_its_bound(monkeypatch):
    monkeypatch.setattr(interning, "MOST", 3)
    sets = RuleSets()
    for code in range(10):
        rules = ({"action": "FailJob", "onExitCodes": {"operator": "In", "values": [code]}},)
        assert sets.shared(rules) == rules
        assert len(sets) <= 3


def test_the_verdicts_keep_one_copy_of_the_rules_their_jobs_share():
    """At 100,000 Jobs the verdicts' table of Jobs (10,000 kept) held each Job's rules as
    decoded: about 14 MB of equal copies."""
    from kubernetes import client

    from webhook.controller.verdicts import Verdicts

    verdicts = Verdicts(client.ApiClient(client.Configuration()), None)

    def job(i: int) -> dict:
        spec = {"podFailurePolicy": {"rules": json.loads(json.dumps(RULES))}, "template": {}}
        meta = {"uid": f"u{i}", "namespace": "ml", "name": f"j{i}"}
        return {"metadata": meta, "spec": spec}

    for i in range(3):
        verdicts._apply_job("ADDED", job(i))
    kept = [verdicts._jobs[f"u{i}"][1] for i in range(3)]
    assert kept[0] == RULES and kept[1] is kept[0] and kept[2] is kept[0]
