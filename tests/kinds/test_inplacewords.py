"""``retry-webhook explain`` of restarts in place (``in-place-exit-codes``): each container's
exit codes read from the rules the object carries, what ends the restarts, the kubelet's
back-off in ``--simulate``, and JSON that says the same.

Upstream behaviour pinned here:

- the kubelet takes a container's first restart rule whose exit codes match, In or
  NotIn (``findMatchingContainerRestartRule`` in pkg/api/v1/pod/util.go), so a rule the
  user wrote before the webhook's wins;
- a restart in place is not a pod failure: the Job controller counts container restarts
  only under restartPolicy OnFailure (``pastBackoffLimitOnFailure``);
- the crash-loop back-off (``doBackOff`` in pkg/kubelet/kuberuntime with client-go's
  ``flowcontrol.Backoff``, capped at ``MaxContainerBackOff``, 300 s): the first restart of
  a container finds no back-off entry and is immediate ("Initial crash: Kubernetes attempts
  an immediate restart", pod-lifecycle docs); later ones wait 10 s, doubling, at most 300 s;
  the entry is keyed by the pod's UID, so a new pod starts over;
- ``RestartAllContainers`` restarts the whole pod, init containers first (KEP-5532).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.builders import P
from testkit.cli import run
from testkit.explain import assert_text_and_json_agree, manifest
from testkit.trainer import runtime, trainjob
from webhook import cli, explain
from webhook.cluster.version import GivenVersion
from webhook.kube.restartrules import BACKOFF_MAX_SECONDS, restart_delay
from webhook.kube.versions import KubeVersion
from webhook.policy.config import Config, parse_config

BIN = Path(sys.executable).parent / "retry-webhook"
V136 = KubeVersion(1, 36)

IN_PLACE = {P + "in-place-exit-codes": "42,75", P + "fail-non-retriable": "true"}
DEADLINE = {"activeDeadlineSeconds": 3600}
#: The proxy's own rule, before the webhook's: restart on 3.
OWN_RULE = {"action": "Restart", "exitCodes": {"operator": "In", "values": [3]}}


def job(annotations=IN_PLACE, spec=DEADLINE, containers=("main",), own=None):
    """A Job with in-place codes and a deadline; ``own`` gives containers their own rules."""
    obj = manifest(annotations, spec=spec, containers=containers)
    for container in obj["spec"]["template"]["spec"]["containers"]:
        rules = (own or {}).get(container["name"])
        if rules:
            container["restartPolicy"] = "Never"
            container["restartPolicyRules"] = copy.deepcopy(rules)
    return obj


def explained(obj, config=None, events=None, version=V136):
    prepared, _ = cli.prepare(obj, None)
    parsed = explain.parse_events(events) if events is not None else None
    source = GivenVersion(version) if version is not None else None
    return explain.explain(prepared, config or Config(), None, parsed, version=source)


def one(obj, config=None, events=None, version=V136):
    (item,) = explained(obj, config, events, version)
    return item


def groups(item, container):
    """{outcome: codes} of one container's exit codes."""
    (found,) = [c for c in item.in_place.containers if c.container == container]
    return [(g.outcome, g.codes, g.text) for g in found.groups]


def flat(text):
    """Text with its line breaks undone (the renderer wraps at 80 columns)."""
    return " ".join(text.split())


def others(*skip):
    return [c for c in range(1, 256) if c not in skip]


# --- each container's exit codes ------------------------------------------------------------


def test_each_container_shows_what_each_exit_code_does():
    """Read from the final object: the webhook's rule after the proxy's own, and the
    FailJob rules fail-non-retriable wrote (with the in-place codes in their NotIn)."""
    item = one(job(containers=("main", "proxy"), own={"proxy": [OWN_RULE]}))
    assert groups(item, "main") == [
        ("restart", [42, 75], "exit codes 42 and 75: restarts in place (restart rule 1, "
         "added by retry-policy)"),
        ("Count", [143], "exit code 143: a new pod, counts against backoffLimit (no rule "
         "matches)"),
        ("FailJob", others(42, 75, 143), "any other exit code: the Job fails at once "
         "(FailJob, rule 2)"),
    ]  # fmt: skip
    proxy = groups(item, "proxy")
    assert [(o, codes) for o, codes, _ in proxy] == [
        ("restart", [3]),
        ("restart", [42, 75]),
        ("Count", [143]),
        ("FailJob", others(3, 42, 75, 143)),
    ]
    assert "your restart rule 1" in proxy[0][2]
    assert "restart rule 2, added by retry-policy" in proxy[1][2]
    text = explain.render_text([item])
    assert "Exit codes, container by container" in text
    assert "  proxy:\n    - exit code 3: restarts in place (your restart rule 1)" in text
    # The rule fail-non-retriable wrote is named as its, in-place codes and all.
    # (rules[0] is fail-non-retriable's Count rule on DisruptionTarget.)
    assert item.rules[1].when == "a non-zero exit code other than 42, 75 or 143 in container main"
    assert item.rules[1].origin == "added by retry-policy for fail-non-retriable"
    assert_text_and_json_agree(item)


def test_your_earlier_rule_on_the_same_code_wins():
    """``findMatchingContainerRestartRule``: the first rule that matches decides. The
    user's Restart on 42 comes before the webhook's RestartAllContainers on 42 and 75, so
    42 restarts the container alone and only 75 the whole pod."""
    mine = [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]
    obj = job({**IN_PLACE, P + "in-place-scope": "pod"}, own={"main": mine})
    item = one(obj, events="42,75")
    assert [(o, codes) for o, codes, _ in groups(item, "main")][:2] == [
        ("restart", [42]),
        ("restart-pod", [75]),
    ]
    first, second = (step.in_place[0] for step in item.simulation.steps)
    assert (first.whole_pod, first.rule, first.origin) == (False, 1, "your rule")
    assert (second.whole_pod, second.rule, second.origin) == (True, 2, "added by retry-policy")
    text = flat(explain.render_text([item]))
    assert "Container main restarts in place at once" in text
    assert "The whole pod restarts in place" in text


def test_not_in_rules_match_every_other_code_success_too():
    """The kubelet's NotIn: a rule of the user's restarting on anything but 1, 0 included
    (``findMatchingContainerRestartRule`` matches exit code 0 like any other, and
    ``ContainerShouldRestart`` restarts on it): the container never completes."""
    mine = [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [1]}}]
    item = one(job(annotations=None, spec=DEADLINE, own={"main": mine}), events="7,0,1")
    assert [(o, codes) for o, codes, _ in groups(item, "main")] == [
        ("restart", [0, *others(1)]),
        ("Count", [1]),
    ]
    text = groups(item, "main")[0][2]
    assert text.startswith("exit codes 0 and 2-255: restarts in place (your restart rule 1)")
    assert text.endswith(
        "exit code 0 is success: the container never completes, nor does its pod; only "
        "activeDeadlineSeconds ends it"
    )
    restarted, succeeded, failed = item.simulation.steps
    assert restarted.in_place and not failed.in_place
    assert [(r.exit_code, r.restart, r.delay_seconds) for r in succeeded.in_place] == [(0, 2, 10)]
    assert succeeded.what == "exit code 0 (success) in container main"
    assert failed.counted_failures == 1
    assert_text_and_json_agree(item)


@pytest.mark.parametrize("action", ["Restart", "RestartAllContainers"])
def test_in_rules_and_on_failure_never_restart_a_success(action):
    """An In rule cannot name 0 as a failure (the webhook's never does), and a container's
    own OnFailure restarts only on a non-zero exit (``ContainerShouldRestart``)."""
    annotations = {**IN_PLACE, P + "in-place-scope": "pod" if "All" in action else "container"}
    obj = job(annotations, containers=("main", "exporter"))
    obj["spec"]["template"]["spec"]["containers"][1]["restartPolicy"] = "OnFailure"
    item = one(obj)
    for name in ("main", "exporter"):
        assert all(0 not in codes for _, codes, _ in groups(item, name))
    assert groups(item, "exporter")[0][:2] == ("restart", others())
    assert "its restartPolicy OnFailure" in groups(item, "exporter")[0][2]


def test_a_success_no_rule_restarts_is_refused_in_simulate():
    """Exit code 0 is a success: with no rule restarting on it, the event is no failure
    and nothing to simulate; with no container restarting in place at all, likewise."""
    with pytest.raises(explain.ExplainError, match="exit code 0 is success and no restart rule"):
        one(job(), events="42,0")
    plain = job(annotations={P + "fail-non-retriable": "true"})
    with pytest.raises(explain.ExplainError, match="event 2 '0': exit code 0 is success, and no"):
        one(plain, events="1,0")
    # Beside a failure, a container that succeeded is just done: the pod fails.
    step = one(job(containers=("main", "proxy")), events="1+proxy:0").simulation.steps[0]
    assert step.action == "FailJob" and not step.in_place


def test_whole_pod_scope_says_the_pod_restarts():
    item = one(job({**IN_PLACE, P + "in-place-scope": "pod"}), events="42")
    assert groups(item, "main")[0][:2] == ("restart-pod", [42, 75])
    (step,) = item.simulation.steps
    assert step.in_place[0].whole_pod
    assert "the whole pod restarts in place at once, init containers first" in step.result
    assert item.simulation.ending.state == "Running"
    assert "goes on in the same pod" in item.simulation.ending.message


def with_sidecar(rules, annotations=IN_PLACE):
    obj = job(annotations)
    obj["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "proxy", "image": "envoy", "restartPolicy": "Always", "restartPolicyRules": rules}
    ]
    return obj


def test_native_sidecars_own_rules_are_shown():
    """A native sidecar may carry rules (``restartAllContainersActionInUse`` in
    pkg/api/pod/util.go lets RestartAllContainersOnContainerExits allow them): one whose
    action is RestartAllContainers restarts the pod in place; every other exit restarts
    the sidecar (its restartPolicy Always). Never a pod failure."""
    mine = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}]
    item = one(with_sidecar(mine))
    (proxy,) = [c for c in item.in_place.containers if c.container == "proxy"]
    assert proxy.sidecar
    assert [(g.outcome, g.codes) for g in proxy.groups] == [
        ("restart-pod", [88]),
        ("restart", [c for c in range(256) if c != 88]),
    ]
    assert proxy.groups[0].text == (
        "exit code 88: the whole pod restarts in place (your restart rule 1)"
    )
    assert (
        proxy.groups[1].text == "any other exit code: restarts in place (its restartPolicy Always)"
    )
    text = explain.render_text([item])
    assert "  proxy (native sidecar):\n    - exit code 88: the whole pod restarts in place" in text
    data = explain.to_json([item])["items"][0]["inPlace"]["containers"]
    assert [(c["container"], c["sidecar"]) for c in data] == [("main", False), ("proxy", True)]


def test_a_sidecars_exit_restarts_it_or_the_pod_never_fails_it():
    mine = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}]
    item = one(with_sidecar(mine), events="proxy:88,proxy:1,proxy:1,1")
    whole, alone, again, failed = item.simulation.steps
    assert [(r.container, r.whole_pod, r.rule) for r in whole.in_place] == [("proxy", True, 1)]
    assert [(r.container, r.whole_pod, r.origin, r.delay_seconds) for r in alone.in_place] == [
        ("proxy", False, "its restartPolicy Always", 10)
    ]
    assert again.in_place[0].delay_seconds == 20
    assert not any(s.counted for s in (whole, alone, again))
    assert failed.action == "FailJob"
    # Beside the main container's failure, the sidecar's exit is its shutdown.
    (shutdown,) = one(with_sidecar(mine), events="1+proxy:88").simulation.steps
    assert shutdown.action == "FailJob" and not shutdown.in_place


def test_a_sidecars_rules_alone_make_a_plan():
    mine = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}]
    item = one(
        with_sidecar(mine, annotations={P + "fail-non-retriable": "true"}), events="proxy:88"
    )
    assert [c.container for c in item.in_place.containers] == ["main", "proxy"]
    assert item.simulation.steps[0].in_place[0].whole_pod


# --- --simulate -----------------------------------------------------------------------------


def test_simulate_two_restarts_in_place_then_a_failure_the_rules_judge():
    """42 twice: the same pod goes on (first restart at once, the second after 10 s);
    then 1 fails the pod, and the FailJob rule fail-non-retriable wrote fails the Job."""
    item = one(job(), events="42,42,1")
    first, second, third = item.simulation.steps
    assert [s.pod for s in (first, second, third)] == [1, 1, 1]
    assert [(r.restart, r.delay_seconds) for s in (first, second) for r in s.in_place] == [
        (1, 0),
        (2, 10),
    ]
    assert not first.counted and first.counted_failures == 0 and first.rule is None
    # (Rule 1 is fail-non-retriable's Count rule on DisruptionTarget.)
    assert (third.in_place, third.rule, third.action) == ((), 2, "FailJob")
    ending = item.simulation.ending
    assert (ending.state, ending.reason) == ("Failed", "PodFailurePolicy")
    assert ending.message == "pod 1 matched FailJob rule 2"
    summary = item.simulation.in_place
    assert (summary.restarts, summary.backoff_seconds) == (2, 10)
    assert "used none of the retry budget" in summary.text
    assert "only spec.activeDeadlineSeconds (3600 s) ends them" in summary.text
    text = flat(explain.render_text([item]))
    assert "restarts in place at once (its restart number 1 in this pod" in text
    assert "restarts in place after 10 s back-off (its restart number 2" in text
    assert_text_and_json_agree(item)


def test_back_off_doubles_and_caps_at_max_container_backoff():
    """10 s doubling after the immediate first restart, capped at ``MaxContainerBackOff``."""
    item = one(job(), events=",".join(["42"] * 9))
    delays = [s.in_place[0].delay_seconds for s in item.simulation.steps]
    assert delays == [0, 10, 20, 40, 80, 160, 300, 300, 300]
    assert max(delays) == BACKOFF_MAX_SECONDS
    assert [restart_delay(n) for n in (1, 2, 3, 7, 100)] == [0, 10, 20, 300, 300]
    assert item.simulation.in_place.backoff_seconds == sum(delays)
    # Nothing was counted: the Job would go on (until its deadline).
    assert item.simulation.ending.state == "Running"


def test_a_new_pod_starts_its_back_off_over():
    """The back-off entry is keyed by the pod's UID: after a counted failure (143 is
    retriable), the next pod's first restart is immediate again."""
    steps = one(job(), events="42,42,143,42").simulation.steps
    assert [s.pod for s in steps] == [1, 1, 1, 2]
    assert [s.attempt for s in steps] == [1, 1, 1, 2]
    assert steps[2].counted and not steps[2].in_place
    assert (steps[3].in_place[0].restart, steps[3].in_place[0].delay_seconds) == (1, 0)


def test_each_container_has_its_own_back_off():
    steps = one(job(containers=("main", "proxy")), events="42,proxy:42,42").simulation.steps
    assert [(r.container, r.restart, r.delay_seconds) for s in steps for r in s.in_place] == [
        ("main", 1, 0),
        ("proxy", 1, 0),
        ("main", 2, 10),
    ]


def test_disruptions_never_restart_in_place():
    """A disrupted pod is being deleted: even 143, restarted in place when the container
    exits with it, is then the pod's failure, judged by the podFailurePolicy."""
    obj = job({P + "in-place-exit-codes": "143", P + "ignore-disruptions": "true"})
    plain, disrupted = one(obj, events="143,disruption").simulation.steps
    assert plain.in_place and not disrupted.in_place
    assert disrupted.action == "Ignore"


def test_restarts_in_place_do_not_advance_placement():
    """non-spot-attempts counts pods: the pod webhook places attempt a on non-spot nodes
    when a >= B + 1 - N; restarts in place make no pod, so they move nothing."""
    obj = job({**IN_PLACE, P + "backoff-limit": "1", P + "non-spot-attempts": "1"})
    item = one(obj, events="42,42,42,143")
    assert [s.nodes for s in item.simulation.steps] == ["any node"] * 4
    assert "attempt 2 runs next, on non-spot nodes only" in item.simulation.ending.message
    note = next(n for n in item.notes if n.startswith("restarts in place are not attempts"))
    assert "non-spot-attempts counts pods" in note


def test_examples_include_an_in_place_code():
    item = one(job())
    assert any(
        e.startswith("exit code 42 in container main: restarts in place (restart rule 1")
        and "not a pod failure, not counted" in e
        for e in item.examples
    )


def test_an_event_with_an_in_place_exit_and_a_final_one_is_refused():
    """A container that restarts in place keeps the pod running: the pod does not fail
    with the other container's exit yet, so the event is not a pod failure."""
    with pytest.raises(explain.ExplainError, match="restart in place, so the pod does not"):
        one(job(containers=("main", "proxy")), events="1+proxy:42")


# --- what ends them ---------------------------------------------------------------------


def test_bound_is_your_deadline():
    item = one(job())
    assert item.in_place.bounded
    assert item.in_place.bound.startswith(
        "What ends restarts in place: spec.activeDeadlineSeconds (3600 s, your own): the "
        "Job fails (DeadlineExceeded)"
    )
    assert "No retry budget does: a restart in place is not a pod failure" in item.in_place.bound


def test_bound_is_the_admins_default_deadline():
    config = parse_config("guardRails: {inPlaceDeadlineSeconds: 1800}")
    item = one(job(spec=None), config)
    assert (
        "spec.activeDeadlineSeconds (1800 s, set by retry-policy from "
        "guardRails.inPlaceDeadlineSeconds)" in item.in_place.bound
    )


def test_unbounded_when_the_admin_allows_it():
    config = parse_config("guardRails: {allowUnboundedInPlace: true}")
    item = one(job(spec=None), config, events="42")
    assert not item.in_place.bounded
    assert "nothing: no activeDeadlineSeconds is set" in item.in_place.bound
    assert "nothing ends them" in item.simulation.in_place.text


def test_pod_template_deadline_ends_each_pod():
    obj = job(spec=None)
    obj["spec"]["template"]["spec"]["activeDeadlineSeconds"] = 600
    item = one(obj, events=",".join(["42"] * 7))
    assert "spec.template.spec.activeDeadlineSeconds (600 s, your own): each pod fails" in (
        item.in_place.bound
    )
    # 0+10+20+40+80+160+300 = 610 s of back-off in one pod: past its deadline.
    assert "The back-off alone (610 s) reaches" in item.simulation.in_place.text


def test_rules_a_cluster_drops_are_said_and_not_shown():
    """Before 1.35 the API server drops restartPolicyRules (ContainerRestartRules off)."""
    mine = [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]
    obj = job(annotations=None, own={"main": mine})
    old = one(obj, events="42", version=KubeVersion(1, 34))
    assert old.in_place is None
    assert any("drops them: no container restarts in place" in n for n in old.notes)
    assert not old.simulation.steps[0].in_place
    assert one(obj, version=KubeVersion(1, 35)).in_place is not None


# --- every kind with a pod template -----------------------------------------------------------


def test_cronjob_jobs_restart_in_place():
    obj = job()
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": dict(IN_PLACE)},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": obj["spec"]}},
    }
    item = one(cron, events="42,1")
    assert groups(item, "main")[0][:2] == ("restart", [42, 75])
    assert "spec.jobTemplate.spec.activeDeadlineSeconds (3600 s" in item.in_place.bound
    assert item.simulation.ending.reason == "PodFailurePolicy"


def jobset_with_in_place():
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "pretrain", "namespace": "ml", "annotations": dict(IN_PLACE)},
        "spec": {
            "failurePolicy": {"maxRestarts": 2},
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 1,
                    "template": {"spec": {**DEADLINE, **job()["spec"]}},
                }
            ],
        },
    }


def test_jobset_replicated_jobs_restart_in_place():
    parts = {i.part: i for i in explained(jobset_with_in_place(), events="42,42,1")}
    child = parts["replicatedJob workers"]
    assert groups(child, "main")[0][:2] == ("restart", [42, 75])
    assert "then the JobSet's failure policy decides" in child.in_place.bound
    steps = child.simulation.steps
    assert [r.delay_seconds for s in steps[:2] for r in s.in_place] == [0, 10]
    assert steps[2].action == "FailJob"
    assert child.simulation.in_place.restarts == 2
    assert_text_and_json_agree(child)


def test_jobset_deadline_a_rule_restarts_past_uncounted_ends_nothing():
    """As admission judges (``kinds.jobset.rules.in_place_bound``): a rule ending in
    AndIgnoreMaxRestarts that takes DeadlineExceeded restarts the set without checking
    maxRestarts (``restartJobSetAndIgnoreMaxRestartsActionApplier``); admitted only with
    the admin's permission, and explained as unbounded."""
    obj = jobset_with_in_place()
    obj["spec"]["failurePolicy"]["rules"] = [
        {
            "name": "again",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["DeadlineExceeded"],
        }
    ]
    config = parse_config("guardRails: {allowUnboundedInPlace: true}")
    parts = {i.part: i for i in explained(obj, config, events="42")}
    child = parts["replicatedJob workers"]
    assert not child.in_place.bounded
    assert child.in_place.bound.startswith(
        "What ends restarts in place: nothing: spec.replicatedJobs[0].template.spec."
        "activeDeadlineSeconds bounds nothing: your spec.failurePolicy.rules[0] "
        "(RestartJobSetAndIgnoreMaxRestarts) restarts the set without counting"
    )
    assert "(guardRails.allowUnboundedInPlace allows it)" in child.in_place.bound
    assert "nothing ends them (a JobSet rule restarts" in child.simulation.in_place.text
    # Without it the plain deadline ends them, then the JobSet's rules decide.
    plain = {i.part: i for i in explained(jobset_with_in_place())}["replicatedJob workers"]
    assert plain.in_place.bounded


def trainjob_stream(deadline=7200):
    """A TrainJob with in-place codes and a deadline, and its runtime, as one input."""
    ref = {"name": "torch-distributed", "kind": "TrainingRuntime"}
    train = trainjob(dict(IN_PLACE), ref=ref, applied=False)
    train["spec"]["activeDeadlineSeconds"] = deadline
    return yaml.safe_dump_all([runtime(kind="TrainingRuntime"), train])


def test_trainjob_jobset_is_judged_for_the_clusters_version(tmp_path):
    """The JobSet a TrainJob's runtime makes is reviewed for the same cluster version as
    the TrainJob: it gets the rules (it used to be explained as if nothing applied)."""
    path = tmp_path / "train.yaml"
    path.write_text(trainjob_stream())
    code, out, err = run(
        ["explain", "-f", str(path), "--kubernetes-version", "1.36", "-o", "json", "--simulate",
         "42,1"]
    )  # fmt: skip
    assert code == 0, err
    parts = {i["part"]: i for i in json.loads(out)["items"]}
    child = parts["replicatedJob node"]
    (node,) = child["inPlace"]["containers"]
    assert node["groups"][0]["codes"] == [42, 75]
    assert (
        "the TrainJob's spec.activeDeadlineSeconds (7200 s, your own)"
        in (child["inPlace"]["bound"])
    )
    first, second = child["simulation"]["steps"]
    assert first["inPlace"][0]["delaySeconds"] == 0
    assert second["action"] == "FailJob"
    settings = {s["name"]: s["value"] for s in parts[""]["settings"]}
    assert settings["in-place-exit-codes"] == "42,75"


def test_bare_pod_restarts_in_place_and_then_fails():
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "solo",
            "annotations": {P + "in-place-exit-codes": "42", P + "in-place-scope": "pod"},
        },
        "spec": {
            "activeDeadlineSeconds": 900,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }
    item = one(pod, events="42,42,1")
    assert groups(item, "main") == [
        ("restart-pod", [42], "exit code 42: the whole pod restarts in place (restart rule 1, "
         "added by retry-policy)"),
        ("pod-fails", others(42), "any other exit code: the pod fails; nothing retries a Pod"),
    ]  # fmt: skip
    assert "spec.activeDeadlineSeconds (900 s, your own): the Pod fails" in item.in_place.bound
    *restarts, failed = item.simulation.steps
    assert [s.in_place[0].delay_seconds for s in restarts] == [0, 10]
    assert not failed.in_place
    assert item.simulation.ending.state == "Failed"
    text = explain.render_text([item])
    assert "Outcome: the Pod fails; phase Failed (event 3 fails it)." in text
    assert all(len(line) <= 80 for line in text.splitlines())


# --- the CLI ----------------------------------------------------------------------------------


def test_cli_text_and_json_through_the_installed_entry(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(containers=("main", "proxy"), own={"proxy": [OWN_RULE]})))
    base = [str(BIN), "explain", "-f", str(path), "--simulate", "42,42,1"]
    text = subprocess.run(
        [*base, "--kubernetes-version", "1.36"], capture_output=True, text=True, check=False
    )
    assert text.returncode == 0, text.stderr
    assert "Note:" not in text.stderr
    out = text.stdout
    assert "    - exit code 3: restarts in place (your restart rule 1)" in out
    assert all(len(line) <= 80 for line in out.splitlines())
    out = flat(out)
    assert "Container main restarts in place at once" in out
    assert "restarts in place after 10 s back-off" in out
    assert "reason PodFailurePolicy" in out
    assert "In place: 2 restarts, 10 s of back-off in all" in out
    data = subprocess.run(
        [*base, "--kubernetes-version", "1.36", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    (item,) = json.loads(data.stdout)["items"]
    proxy = item["inPlace"]["containers"][1]
    assert proxy["container"] == "proxy"
    assert [g["codes"] for g in proxy["groups"][:2]] == [[3], [42, 75]]
    steps = item["simulation"]["steps"]
    assert [r["delaySeconds"] for s in steps for r in s["inPlace"]] == [0, 10]
    assert [r["restart"] for s in steps for r in s["inPlace"]] == [1, 2]
    assert item["simulation"]["inPlace"]["backoffSeconds"] == 10
    assert item["simulation"]["outcome"]["reason"] == "PodFailurePolicy"
    # Without --kubernetes-version the CLI assumes one, and says so.
    assumed = subprocess.run(base, capture_output=True, text=True, check=False)
    assert assumed.returncode == 0 and "Note: in-place restarts judged for" in assumed.stderr


def test_cli_refuses_an_event_the_pod_does_not_fail_with(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(containers=("main", "proxy"))))
    code, _, err = run(
        ["explain", "-f", str(path), "--kubernetes-version", "1.36", "--simulate", "1+proxy:42"]
    )
    assert code == cli.EXIT_INPUT
    assert "give them as separate events, e.g. proxy:42,main:1" in err


def test_an_init_containers_rule_is_named_as_fail_non_retriables():
    """Its NotIn list is the plain retriable set (nothing restarts it in place): still
    recognised as the webhook's, and its exit 42 fails the Job (``matchOnExitCodes``
    reads init containers after the regular ones)."""
    obj = job()
    obj["spec"]["template"]["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    item = one(obj, events="fetch:42")
    assert [(r.when, r.origin) for r in item.rules[1:]] == [
        (
            "a non-zero exit code other than 42, 75 or 143 in container main",
            "added by retry-policy for fail-non-retriable",
        ),
        (
            "a non-zero exit code other than 143 in container fetch",
            "added by retry-policy for fail-non-retriable",
        ),
    ]
    (step,) = item.simulation.steps
    assert (step.in_place, step.action, step.rule) == ((), "FailJob", 3)
