"""Failure categories: the admins' ``categories:`` in the cluster config (checked as
``check-config`` checks them), the annotations' grammar for category names, NVIDIA Xids,
and the classifier (``webhook.cluster.classify``) on pods shaped as the kubelet and the
controllers write them (``testkit.failedpods``)."""

from __future__ import annotations

import pytest

from testkit.jobsim import _disruption
from testkit.verdicts import failed_pod, waiting_pod
from webhook.cluster import classify as cl
from webhook.kube import xid
from webhook.policy import categories as cats
from webhook.policy.config import ConfigError, parse_config
from webhook.policy.grammar import BadValue

NCCL = """
categories:
  - name: NCCLTimeout
    hint: a collective timed out
    match:
      terminationMessage: "NCCL.*[Tt]imeout"
  - name: DeviceFault
    match:
      eventReasons: [GPUUnhealthy]
      eventMessage: "row remap"
  - name: Quota
    hint: the namespace ran out of quota
    match:
      exitCodes: [75]
      podReasons: [UnexpectedAdmissionError]
      containerReasons: [ContainerCannotRun]
      disruptionReasons: [DeletionByTaintManager]
"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return [str(p) for p in caught.value.problems]


# --- the config's categories ---------------------------------------------------------------


def test_admins_categories_are_read_in_order_and_a_builtin_name_keeps_its_hint():
    config = parse_config(NCCL)
    assert [c.name for c in config.categories] == ["NCCLTimeout", "DeviceFault", "Quota"]
    assert config.categories[1].hint == cats.BUILTIN_HINTS["DeviceFault"]
    assert cats.names(config.categories)[:3] == ("NCCLTimeout", "DeviceFault", "Quota")
    assert "AppError" in cats.names(config.categories)


@pytest.mark.parametrize(
    ("entry", "where", "says"),
    [
        ("{name: 'bad name', hint: h, match: {exitCodes: [1]}}", "categories[0]", "not a category"),
        ("{name: X, match: {exitCodes: [1]}}", "categories[0] (X).hint", "needs a hint"),
        ("{name: X, hint: h, match: {}}", "categories[0] (X).match", "needs a mapping"),
        ("{name: X, hint: h, match: {exitCodes: [0]}}", "(X).match.exitCodes", "not an exit code"),
        ("{name: X, hint: h, match: {terminationMessage: '(?<=a)b'}}", "(X)", "as Go does"),
        ("{name: X, hint: h, match: {terminationMessage: '.*'}}", "(X)", "matches every text"),
        ("{name: X, hint: h, match: {eventMesage: a}}", "(X).match.eventMesage", "unknown key"),
        ("{name: FreeBudgetExhausted, hint: h, match: {exitCodes: [1]}}", "(Free", "own"),
    ],
)
def test_check_config_refuses_a_bad_category_naming_it(entry, where, says):
    found = problems_of(f"categories:\n  - {entry}\n")
    assert any(where in p and says in p for p in found), found


def test_a_category_named_twice_is_refused():
    found = problems_of(
        "categories:\n  - {name: X, hint: h, match: {exitCodes: [1]}}\n"
        "  - {name: X, hint: h, match: {exitCodes: [2]}}\n"
    )
    assert any("categories[1] (X).name" in p and "named twice" in p for p in found), found


def test_a_rule_names_the_categories_of_its_condition_patterns_only():
    rule = {
        "action": "FailJob",
        "onPodConditions": [
            {"type": "retry-policy.dev/DisruptionBudgetExhausted", "status": "True"},
            {"type": "retry-policy.dev/ImagePull", "status": "True"},
            {"type": "DisruptionTarget", "status": "True"},
        ],
    }
    assert cats.named_by(rule) == ["ImagePull"]
    assert cats.named_by({"action": "Ignore", "onExitCodes": {"values": [1]}}) == []


def test_category_conditions_are_written_where_read_unless_the_admin_says_always():
    assert parse_config("").category_conditions == "WhenRead"
    assert parse_config("categoryConditions: Always\n").category_conditions == "Always"
    found = problems_of("categoryConditions: always\n")
    assert any("categoryConditions" in p and "'always'" in p and "WhenRead" in p for p in found)


def test_a_default_naming_no_category_is_refused_listing_the_categories():
    found = problems_of("defaults:\n  free-categories: [DeviceFault, GpuFault]\n")
    assert any("defaults.free-categories" in p and "GpuFault: no such category" in p for p in found)
    assert any("DeviceFault, NodeFailure, Preempted" in p for p in found)
    config = parse_config(NCCL + "defaults:\n  fail-categories: NCCLTimeout\n")
    assert config.defaults["fail-categories"] == ("NCCLTimeout",)


def test_a_namespace_default_naming_no_category_is_refused_listing_the_categories():
    found = problems_of(
        NCCL + "namespaces:\n  ml:\n    defaults: {fail-categories: [ImagePull, GpuFault]}\n"
    )
    said = "GpuFault: no such category; the categories are NCCLTimeout, DeviceFault, Quota"
    where = "namespaces.ml.defaults.fail-categories"
    assert any(p.startswith(f"{where}: {said}") for p in found), found
    config = parse_config(NCCL + "namespaces:\n  ml:\n    defaults: {free-categories: Quota}\n")
    assert config.namespaces["ml"].defaults["free-categories"] == ("Quota",)


@pytest.mark.parametrize("text", ["", "a,,b", "bad name", "x" * 64, "a/b"])
def test_category_names_grammar_refuses(text):
    with pytest.raises(BadValue) as caught:
        cats.parse_names(text)
    assert "accepted: a comma-separated list of category names" in str(caught.value)


def test_category_names_grammar_sorts_and_keeps_none_for_off():
    assert cats.parse_names("NodeFailure, DeviceFault,NodeFailure") == (
        "DeviceFault",
        "NodeFailure",
    )
    assert cats.parse_names("none") is None
    assert cats.category_of("retry-policy.dev/DeviceFault") == "DeviceFault"
    assert cats.category_of("retry-policy.dev/PeerDisrupted") is None
    assert cats.category_of("DisruptionTarget") is None


# --- NVIDIA Xids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("NVRM: Xid (PCI:0000:10:1c): 79, pid=1896, GPU has fallen off the bus.", 79),
        ("CUDA error; kernel log says XID 48", 48),
        ("xid=94 contained ECC error", 94),
        ("NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception", None),  # the application's
        ("NVRM: Xid (PCI:0000:3b:00): 31, MMU Fault", None),
        ("no such thing as xidx 79", None),
    ],
)
def test_an_xid_is_a_device_fault_only_where_nvidia_documents_hardware_or_driver(text, found):
    assert xid.device_fault(text) == found


def test_nvidias_application_xids_are_not_device_faults():
    # upstream: applicationErrorXids (NVIDIA/k8s-device-plugin internal/rm/health.go) and
    # xidsToSkip (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/device_health.go)
    assert not {13, 31, 43, 45, 68, 109} & xid.DEVICE_FAULT_XIDS
    assert {48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140} <= xid.DEVICE_FAULT_XIDS


# --- the classifier --------------------------------------------------------------------------


def with_condition(pod: dict, condition: dict) -> dict:
    pod["status"].setdefault("conditions", []).append(condition)
    return pod


def waiting(reason: str, message: str = "") -> dict:
    return waiting_pod("w", reason, message)


@pytest.mark.parametrize(
    ("reason", "lost", "category"),
    [
        # upstream: addConditionAndDeletePod (pkg/controller/devicetainteviction)
        ("DeletionByDeviceTaintManager", None, "DeviceFault"),
        # upstream: gcOrphaned, markFailedAndDeletePodWithCondition (pkg/controller/podgc)
        ("DeletionByPodGC", None, "NodeFailure"),
        ("TerminationByKubelet", None, "NodeFailure"),
        # upstream: addConditionAndDeletePod (pkg/controller/tainteviction)
        ("DeletionByTaintManager", True, "NodeFailure"),
        ("DeletionByTaintManager", None, "NodeFailure"),
        ("DeletionByTaintManager", False, "Preempted"),
        ("PreemptionByScheduler", None, "Preempted"),
        ("EvictionByEvictionAPI", None, "Preempted"),
        ("DeletionByDisruptor", None, "Preempted"),
    ],
)
def test_a_disruption_decides_by_its_reason(reason, lost, category):
    pod = with_condition(failed_pod("p", codes={"main": 143}), _disruption(reason))
    found = cl.classify(pod, node_lost=lost)
    assert (found.category, found.signal) == (category, "DisruptionReason")
    assert reason in found.detail


@pytest.mark.parametrize(
    ("reason", "category"),
    [
        ("ErrImagePull", "ImagePull"),
        ("ImagePullBackOff", "ImagePull"),
        ("InvalidImageName", "ImagePull"),
        ("CreateContainerConfigError", "ConfigError"),
        ("CreateContainerError", "ConfigError"),
        ("RunContainerError", "ConfigError"),
        ("ContainerCreating", "StartTimeout"),
    ],
)
def test_a_pod_stuck_past_its_start_deadline_says_why_it_never_started(reason, category):
    found = cl.classify(waiting(reason, "Back-off pulling image"), stuck=True)
    assert (found.category, found.signal) == (category, "StartDeadline")


def test_an_unscheduled_pod_is_unschedulable_and_without_the_condition_a_start_timeout():
    pod = waiting_pod("u", "", node=None)
    assert cl.classify(pod, stuck=True).category == "StartTimeout"
    # upstream: PodReasonUnschedulable (k8s.io/api core/v1), set by the scheduler's
    # handleSchedulingFailure
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4"}
    ]
    assert cl.classify(pod, stuck=True).category == "Unschedulable"
    assert cl.classify(pod).category == "Unschedulable"


def test_a_failed_pod_waiting_on_its_image_is_an_image_pull_failure():
    pod = waiting("ImagePullBackOff")
    pod["status"]["phase"] = "Failed"
    pod["status"]["reason"] = "DeadlineExceeded"
    found = cl.classify(pod)
    assert (found.category, found.signal) == ("ImagePull", "ContainerReason")


def test_an_xid_in_a_termination_message_or_an_event_is_a_device_fault():
    pod = failed_pod(
        "x", messages={"main": "NVRM: Xid (PCI:0000:10:1c): 79, GPU has fallen off the bus"}
    )
    assert cl.classify(pod).signal == "TerminationMessage"
    asked = []

    def events():
        asked.append(1)
        return [cl.PodEvent("GPUHealth", "Xid 48 on GPU-1")]

    plain = failed_pod("y", codes={"main": 1})
    found = cl.classify(plain, events=events)
    assert (found.category, found.signal) == ("DeviceFault", "Event")
    assert asked == [1]


def test_oom_killed_then_app_error_and_events_are_read_once_at_most():
    asked = []

    def events():
        asked.append(1)
        return []

    oom = failed_pod("o", codes={"main": 137}, reasons={"main": "OOMKilled"})
    assert cl.classify(oom, events=events).category == "OOMKilled"
    plain = failed_pod("a", codes={"main": 2})
    found = cl.classify(plain, events=events)
    assert (found.category, found.signal, found.detail) == (
        "AppError",
        "ExitCode",
        "container main exited 2",
    )
    assert asked == [1, 1]
    # A disruption decides without asking.
    disrupted = with_condition(failed_pod("d"), _disruption("DeletionByPodGC"))
    cl.classify(disrupted, events=events)
    assert asked == [1, 1]


def test_admins_categories_come_first_in_their_order_each_by_its_signal():
    config = parse_config(NCCL)
    message = failed_pod(
        "n", messages={"main": "watchdog: NCCL collective operation timeout after 1800000 ms"}
    )
    found = cl.classify(message, config.categories)
    assert (found.category, found.signal) == ("NCCLTimeout", "TerminationMessage")
    assert found.hint(config.categories) == "a collective timed out"
    event = cl.classify(
        failed_pod("e", codes={"main": 1}),
        config.categories,
        events=lambda: [cl.PodEvent("GPUUnhealthy", "row remap pending")],
    )
    assert (event.category, event.signal) == ("DeviceFault", "Event")
    quota = failed_pod("q", codes={"main": 75})
    assert cl.classify(quota, config.categories).signal == "ExitCode"
    tainted = with_condition(failed_pod("t"), _disruption("DeletionByTaintManager"))
    found = cl.classify(tainted, config.categories, node_lost=True)
    assert (found.category, found.signal) == ("Quota", "DisruptionReason")


def test_the_category_the_controller_wrote_is_read_back():
    pod = with_condition(
        failed_pod("c"),
        {"type": "retry-policy.dev/NodeFailure", "status": "True", "reason": "DisruptionReason"},
    )
    name, condition = cl.of_conditions(pod)
    assert name == "NodeFailure" and condition["reason"] == "DisruptionReason"
    assert cl.of_conditions(failed_pod("none")) is None


def test_device_faults_and_node_failures_feed_avoid_failed_nodes():
    """``failed_node`` (``webhook.cluster.history``): a device taint's eviction and a pod
    the controller classified DeviceFault or NodeFailure leave their node to avoid; a
    preemption does not."""
    from webhook.cluster.history import failed_node

    tainted = with_condition(
        failed_pod("d", node="gpu-7"), _disruption("DeletionByDeviceTaintManager")
    )
    assert failed_node(tainted) == "gpu-7"
    preempted = with_condition(failed_pod("p", node="gpu-8"), _disruption("PreemptionByScheduler"))
    assert failed_node(preempted) is None
    classified = with_condition(
        preempted, {"type": "retry-policy.dev/NodeFailure", "status": "True"}
    )
    assert failed_node(classified) == "gpu-8"
