"""The rules a JobSpec gets are remembered by what they depend on
(``webhook.kinds.ruleplan``): remembered rules must give what working them out anew gives,
whichever policy warmed the memory. A setting our rules read but the key leaves out would
hand one Job another's rules."""

from __future__ import annotations

import itertools

import pytest

from testkit.builders import P, job
from testkit.workloads import mutate
from webhook.admission import engine
from webhook.kinds import ruleplan

#: Policies that differ in one setting each that changes the rules written.
POLICIES = [
    {P + "fail-non-retriable": "true"},
    {P + "fail-non-retriable": "true", P + "retriable-exit-codes": "3"},
    {P + "fail-non-retriable": "true", P + "fail-categories": "ImagePull"},
    {P + "ignore-disruptions": "true"},
    {P + "ignore-disruptions": "true", P + "max-disruptions": "2"},
    {P + "peer-disruptions": "ignore"},
    {P + "peer-disruptions": "count"},
    {P + "free-categories": "NodeFailure"},
    {P + "free-categories": "NodeFailure,DeviceFault"},
    {P + "free-categories": "NodeFailure", P + "max-free-failures": "1"},
    {P + "fail-categories": "ImagePull"},
    {P + "fail-categories": "ConfigError"},
]


def _admitted(annotations: dict) -> tuple:
    engine.MEMO.clear()  # whole verdicts are remembered above the rules: reach them
    verdict, obj = mutate(job(annotations))
    return verdict.allowed, verdict.warnings, obj


def _fresh(annotations: dict) -> tuple:
    ruleplan._REMEMBERED.clear()
    return _admitted(annotations)


@pytest.mark.parametrize("first, second", list(itertools.permutations(range(len(POLICIES)), 2)))
def test_remembered_rules_give_what_fresh_ones_give(first, second):
    expected = _fresh(POLICIES[second])
    _fresh(POLICIES[first])  # warms the memory with another policy's rules
    assert ruleplan._REMEMBERED
    assert _admitted(POLICIES[second]) == expected
