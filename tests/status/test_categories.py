"""``retry-webhook status``: each failed attempt's failure category and hint, as the
controller wrote it on the pod, or as ``status`` reads a pod it wrote none on."""

from __future__ import annotations

from testkit.jobsim import _disruption
from testkit.verdicts import failed_pod
from webhook.policy.config import parse_config
from webhook.status import render
from webhook.status.attempts import attempt_from
from webhook.status.model import JobStory


def test_a_failed_attempt_says_the_category_the_controller_wrote():
    pod = failed_pod("train-a", codes={"main": 1})
    pod["status"]["conditions"].append(
        {
            "type": "retry-policy.dev/NCCLTimeout",
            "status": "True",
            "reason": "TerminationMessage",
            "message": "a collective timed out: a peer or the network failed",
        }
    )
    attempt = attempt_from(pod, "train", [])
    assert attempt.category is not None and attempt.category.by == "controller"
    lines = render._attempt(1, attempt, JobStory("train", "u", "Failed", 1, 0))
    assert "NCCLTimeout (TerminationMessage): a collective timed out" in " ".join(lines)
    said = render._attempt_json(attempt)["category"]
    assert said == {
        "name": "NCCLTimeout",
        "signal": "TerminationMessage",
        "hint": "a collective timed out: a peer or the network failed",
        "by": "controller",
    }


def test_without_the_controllers_condition_status_classifies_the_pod_and_says_so():
    pod = failed_pod("train-b", codes={"main": 143})
    pod["status"]["conditions"].append(_disruption("PreemptionByScheduler"))
    attempt = attempt_from(pod, "train", [])
    text = " ".join(render._attempt(2, attempt, JobStory("train", "u", "Running", 1, 0)))
    assert "Preempted (DisruptionReason, as status reads the pod: the controller wrote none)" in (
        " ".join(text.split())
    )
    running = failed_pod("train-c")
    running["status"]["phase"] = "Running"
    assert attempt_from(running, "train", []).category is None


def test_status_given_the_config_classifies_by_the_admins_categories_too():
    """``--config``: a pod the controller wrote no condition on (``WhenRead``: no rule of
    its workload reads one) is classified as the controller would, the admins' own
    categories first, with their hint."""
    config = parse_config(
        "categories:\n  - {name: BadInput, hint: the input data is bad, match: {exitCodes: [3]}}\n"
    )
    pod = failed_pod("train-d", codes={"main": 3})
    assert attempt_from(pod, "train", []).category.name == "AppError"
    found = attempt_from(pod, "train", [], config.categories).category
    assert (found.name, found.hint, found.by) == ("BadInput", "the input data is bad", "status")
