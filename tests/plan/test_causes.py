"""The per-cause rules, stated once (``webhook.plan.causes``): what the controller acts on,
what ``explain``'s simulation predicts and what ``status`` reports all read them there, so
"the first N disruptions are free" and "replaced after N restarts in place" cannot be
written three ways again."""

from __future__ import annotations

import pytest

from webhook.plan import causes


@pytest.mark.parametrize(
    ("number", "limit", "result"),
    [
        (1, 0, "counted"),  # max-disruptions 0: no disruption is free
        (1, 1, "free"),
        (2, 1, "counted"),
        (2, 2, "free"),
        (3, 2, "counted"),
        (50, 2, "counted"),
    ],
)
def test_the_first_n_disruptions_are_free_and_each_one_after_is_counted(number, limit, result):
    assert causes.disruption(number, limit) == result


@pytest.mark.parametrize(
    ("restarts", "limit", "result"),
    [
        (0, None, False),  # no max-in-place-restarts: never replaced for restarts
        (99, None, False),
        (0, 1, False),
        (1, 1, True),
        (4, 5, False),
        (5, 5, True),
        (6, 5, True),  # (restarts seen late: still over)
    ],
)
def test_a_pod_is_replaced_once_its_restarts_in_place_reach_the_budget(restarts, limit, result):
    assert causes.replaced(restarts, limit) is result


def test_a_disruption_counts_against_its_index_only_with_a_budget_per_index():
    """``job-index-failure-count`` is on the pods of an Indexed Job with
    ``backoffLimitPerIndex`` only (upstream: getPodIndexFailures, with the annotation
    written by getPodsForIndex's pod template in pkg/controller/job/indexed_job_utils.go);
    a JobSet's pods count against the set whatever their Job."""
    per_index = {
        "metadata": {
            "annotations": {
                "batch.kubernetes.io/job-completion-index": "3",
                "batch.kubernetes.io/job-index-failure-count": "1",
            },
            "labels": {"batch.kubernetes.io/controller-uid": "u1"},
        }
    }
    assert causes.disruption_scope(per_index) is not None
    shared = {"metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": "3"}}}
    assert causes.disruption_scope(shared) is None
    in_a_set = {
        "metadata": {
            "annotations": per_index["metadata"]["annotations"],
            "labels": {"jobset.sigs.k8s.io/jobset-uid": "s1"},
        }
    }
    assert causes.disruption_scope(in_a_set) is None
