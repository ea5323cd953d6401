"""The plan as typed values (``webhook.plan.model``): the retry budget of a JobSpec and
the one non-spot boundary that admission, the pod webhook and ``explain`` all place by."""

from __future__ import annotations

import pytest

from testkit.builders import P
from testkit.workloads import FixedAttempts, mutate, pod_template
from webhook.plan.model import BudgetPlan, LimitField, first_non_spot, job_limit_field, non_spot
from webhook.policy.model import Layer, Source, resolve


def policy(limit: int):
    return resolve([Layer(Source.ANNOTATION, {"backoff-limit": limit})])


def test_a_jobs_budget_counts_attempts_of_the_job_or_of_each_index():
    field = job_limit_field(("spec",), {"backoffLimit": 3})
    budget = BudgetPlan.of(policy(3), field, None)
    assert (budget.unit, budget.steps, budget.total, budget.runs) == ("attempt", 4, 4, False)
    assert (budget.scope, budget.text) == ("this Job has", "backoffLimit 3 + 1")
    per_index = job_limit_field(("spec",), {"backoffLimitPerIndex": 1})
    budget = BudgetPlan.of(policy(1), per_index, None)
    assert (budget.unit, budget.total) == ("index", 2)
    assert budget.scope == "each index of this Job has"


def test_a_jobset_part_counts_runs_each_of_the_childs_attempts():
    child = LimitField(("spec", "replicatedJobs", 0, "template", "spec", "backoffLimit"), None, 6)
    budget = BudgetPlan.of(policy(1), child, restarts=3)
    assert (budget.unit, budget.steps, budget.per_step, budget.total) == ("run", 4, 2, 8)
    assert budget.text == "(maxRestarts 3 + 1) x (backoffLimit 1 + 1)"
    # The last 3 attempts lie in the last 2 runs: those go to non-spot nodes.
    assert budget.pod_steps(3) == 2
    assert [budget.non_spot(runs, 3) for runs in range(4)] == [False, False, True, True]


@pytest.mark.parametrize(("limit", "n"), [(3, 1), (3, 4), (5, 2), (0, 1), (2, 0)])
def test_the_boundary_is_the_last_n_of_the_budgets_attempts(limit, n):
    placed = [non_spot(failures, limit, n) for failures in range(limit + 1)]
    assert sum(placed) == n
    assert placed == sorted(placed)  # the last ones
    if n:
        assert placed.index(True) == first_non_spot(limit, n)
    assert not non_spot(0, None, n)  # an unknown budget places nothing


@pytest.mark.parametrize("failures", range(5))
def test_the_pod_webhook_places_a_jobs_pod_by_the_same_boundary(failures):
    """What ``explain`` says (``non_spot``) is what the pod webhook does to the pod."""
    from webhook.cluster.attempts import AttemptLookup

    template = pod_template("main", restart_policy="Never")
    annotations = {P + "backoff-limit": "3", P + "non-spot-attempts": "2"}
    template["metadata"] = {"annotations": annotations}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "train-",
            "namespace": "ml",
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "train",
                    "uid": "u-1",
                    "controller": True,
                }
            ],
        },
        "spec": template["spec"],
    }

    class Counted(FixedAttempts):
        def job_failures(self, namespace, name, uid):
            return AttemptLookup(failures, "Job status (cache)", budget=3)

    verdict, out = mutate(pod, attempts=Counted(failures))
    assert verdict.allowed, verdict.message
    placed = "affinity" in out["spec"]
    assert placed is non_spot(failures, 3, 2)
