"""Each annotation does what it promises under the batch/v1 Job controller that runs the
object (issue 22, part A): exit codes of sidecars, disrupted pods as they really fail,
one failed pod at a time, the 20-rule limit under admin defaults, workloads made by other
controllers, in-place restarts, a budget changed by UPDATE, and empty node selector terms.

Every test names the upstream function whose behaviour it relies on, read in
kubernetes/kubernetes (pkg/controller/job, pkg/apis/batch/validation) and
k8s.io/component-helpers (scheduling/corev1/nodeaffinity). The engine is checked
directly, through ``retry-webhook explain`` (how users check us) and through the real
server as deployed."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from testkit.builders import P, apply, decode_patch, job, job_owner, pod, review
from testkit.cli import run
from testkit.explain import manifest, one
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.kinds import child, cronjob, jobset, pytorchjob, rayjob, replicated
from testkit.servers import eventually, start, stop
from testkit.workloads import kubectl_patch, mutate, validate, validate_schema
from webhook.cluster.attempts import AttemptLookup, placement_budget
from webhook.cluster.facts import NoCluster
from webhook.kube import failurepolicy as fp
from webhook.kube.failurepolicy import ContainerExit, PodFailure
from webhook.kube.podspec import add_non_spot_affinity, requires_spot, spot_requirements
from webhook.plan.record import rule_id
from webhook.policy.config import parse_config

DEFAULTS = parse_config(
    "defaults: {fail-non-retriable: true, ignore-disruptions: true, non-spot-attempts: 1}"
)
NON_SPOT = spot_requirements(parse_config("{}").spot_node_labels)
DISRUPTED = ("DisruptionTarget", "True")


def sidecar_job(annotations=None, **kw):
    """A Job whose pod has two regular containers, a regular init container and a native
    sidecar (an init container with restartPolicy Always)."""
    obj = job(
        annotations,
        containers=[
            {"name": "main", "image": "busybox:1.36"},
            {"name": "logger", "image": "busybox:1.36"},
        ],
        **kw,
    )
    obj["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "setup", "image": "busybox:1.36"},
        {"name": "proxy", "image": "envoy:1.30", "restartPolicy": "Always"},
    ]
    return obj


def write(tmp_path, obj):
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


def rules_of(obj, path=("spec",)):
    spec = obj
    for part in path:
        spec = spec[part]
    return spec.get("podFailurePolicy", {}).get("rules", [])


def terminated(name, code):
    return {"name": name, "state": {"terminated": {"exitCode": code}}}


def failed_pod_status(containers=(), init=(), conditions=()):
    """A failed pod's status as the kubelet reports it."""
    return {
        "status": {
            "phase": "Failed",
            "containerStatuses": [terminated(n, c) for n, c in containers],
            "initContainerStatuses": [terminated(n, c) for n, c in init],
            "conditions": [{"type": t, "status": s} for t, s in conditions],
        }
    }


# --- 3. a native sidecar's shutdown code -----------------------------------------------


def test_fail_non_retriable_names_each_application_container_and_leaves_sidecars_out():
    verdict, out = mutate(sidecar_job({P + "fail-non-retriable": "true"}))
    assert verdict.allowed, verdict.message
    assert rules_of(out) == [
        fp.count_disruptions_rule(),
        *(fp.non_retriable_rule([143], "FailJob", name) for name in ("main", "logger", "setup")),
    ]
    assert (
        "retry-policy: added podFailurePolicy rules FailJob on exit codes NotIn [143] in "
        "main, logger, setup (fail-non-retriable)"
    ) in verdict.warnings


def test_a_sidecar_sigkilled_at_shutdown_does_not_fail_the_job():
    # upstream: matchOnExitCodes (pkg/controller/job/pod_failure_policy.go) reads
    # status.containerStatuses, then status.initContainerStatuses (native sidecars are
    # init containers), and a rule without containerName matches any of them.
    _, out = mutate(sidecar_job({P + "fail-non-retriable": "true"}))
    preempted_main = PodFailure.from_pod(
        failed_pod_status(containers=[("main", 143), ("logger", 0)], init=[("proxy", 137)])
    )
    assert fp.evaluate(rules_of(out), preempted_main) is None  # counted and retried
    # The rule this project wrote before: one rule for every container FailJobs this pod.
    match = fp.evaluate([fp.non_retriable_rule([143])], preempted_main)
    assert match is not None and match.container == ContainerExit("proxy", 137, True)
    # A container injected into the pod after admission (a mesh proxy) is not read either.
    injected = PodFailure.from_pod(
        failed_pod_status(containers=[("main", 143), ("istio-proxy", 137)])
    )
    assert fp.evaluate(rules_of(out), injected) is None
    # The application's own non-retriable codes still fail the Job, init containers' too.
    for status in (
        failed_pod_status(containers=[("logger", 2)]),
        failed_pod_status(init=[("setup", 1)]),
    ):
        match = fp.evaluate(rules_of(out), PodFailure.from_pod(status))
        assert match is not None and match.action == "FailJob"


def test_fail_index_rules_are_per_container_too():
    obj = sidecar_job(
        {P + "fail-non-retriable": "true", P + "on-non-retriable": "fail-index"},
        spec={"completionMode": "Indexed", "completions": 2, "backoffLimitPerIndex": 1},
    )
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    assert [r["action"] for r in rules_of(out)] == ["Count"] + ["FailIndex"] * 3
    assert [r["onExitCodes"]["containerName"] for r in rules_of(out)[1:]] == [
        "main",
        "logger",
        "setup",
    ]


def test_our_rules_are_recognised_and_idempotent():
    _, out = mutate(sidecar_job({P + "fail-non-retriable": "true"}))
    again, twice = mutate(out)
    assert again.patch == [] and twice == out
    assert validate(out).allowed
    assert rules_of(out)[0] == fp.count_disruptions_rule()
    for rule in rules_of(out)[1:]:
        assert fp.is_non_retriable_rule(rule, [143])
    assert not fp.is_non_retriable_rule(fp.non_retriable_rule([143]), [137, 143])
    assert not fp.is_non_retriable_rule({"action": "Count", "onExitCodes": {}}, None)


def test_a_cronjob_update_replaces_the_old_single_rule_with_per_container_rules():
    # A CronJob admitted by the earlier version carries one rule without containerName;
    # changing its policy must take that rule out, not keep it as if it were the user's.
    old_rule = fp.non_retriable_rule([137, 143])
    old = cronjob(
        {P + "fail-non-retriable": "true", P + "retriable-exit-codes": "137,143"},
        job_spec={"podFailurePolicy": {"rules": [old_rule]}, "podReplacementPolicy": "Failed"},
    )
    old["metadata"]["annotations"][P + "applied"] = '{"failNonRetriable":[137,143]}'
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][P + "retriable-exit-codes"] = "143"
    verdict, out = mutate(new, operation="UPDATE", old=old)
    assert verdict.allowed, verdict.message
    assert rules_of(out, ("spec", "jobTemplate", "spec")) == [
        fp.count_disruptions_rule(),
        fp.non_retriable_rule([143], "FailJob", "eval"),
    ]


def test_explain_simulates_a_sidecar_killed_at_shutdown(tmp_path):
    obj = manifest({P + "fail-non-retriable": "true", P + "backoff-limit": "2"})
    obj["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "proxy", "image": "envoy:1.30", "restartPolicy": "Always"}
    ]
    path = write(tmp_path, obj)
    code, out, err = run(["explain", "-f", str(path), "--simulate", "143+proxy:137,1"])
    assert code == 0, err
    text = " ".join(out.split())
    assert (
        "pod 1 (attempt 1, any node): exit code 143 (SIGTERM) in container main, exit code "
        "137 (OOM kill or SIGKILL) in container proxy. No rule matches: counted (1 of 2 "
        "allowed failures used)"
    ) in text
    assert "pod 2 (attempt 2, any node): exit code 1 (application error) in container main. " in (
        text
    )
    assert "Rule 2 (FailJob): the Job fails at once." in text
    # The common failures list the sidecar case without being asked.
    assert (
        "exit code 143 (SIGTERM) in container main, exit code 137 (OOM kill or SIGKILL) in "
        "container proxy: no rule matches; retried, counts against backoffLimit"
    ) in text
    # The grammar refuses what a pod cannot do, naming the event.
    for events, said in (
        ("143+main:1", "gives container main (the main one"),
        ("143+143", "gives the main container two exit codes"),
        ("143+nope:1", "names container 'nope'"),
        ("disruption+disruption", "names disruption twice"),
    ):
        code, _, err = run(["explain", "-f", str(path), "--simulate", events])
        assert code == 2 and said in err, (events, err)


# --- 4. a disrupted pod exits 143 or 137 -------------------------------------------------


@pytest.mark.parametrize(
    "user",
    [
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [137]}},
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [143]}},
        {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [143]}},
        # The sidecar is stopped too, and a rule on its codes matches first.
        {
            "action": "Count",
            "onExitCodes": {"containerName": "proxy", "operator": "In", "values": [137]},
        },
    ],
)
def test_a_user_rule_matching_a_preempted_pods_exit_code_defeats_ignore_disruptions(user):
    # upstream: matchPodFailurePolicy evaluates the rules in order and the first match
    # wins; a preempted pod has DisruptionTarget=True and its containers stopped by
    # SIGTERM (143) or, after the grace period, SIGKILL (137), and the user's rules come
    # before our Ignore.
    obj = sidecar_job(
        {P + "ignore-disruptions": "true"}, spec={"podFailurePolicy": {"rules": [user]}}
    )
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "annotation retry-policy.dev/ignore-disruptions: your spec.podFailurePolicy." in (
        verdict.message
    )
    assert f"rules[0] ({user['action']}) matches a disrupted pod first (container" in (
        verdict.message
    )
    # From an admin default it is skipped instead, with the same reason.
    verdict, out = mutate(sidecar_job(spec={"podFailurePolicy": {"rules": [user]}}), DEFAULTS)
    assert verdict.allowed, verdict.message
    assert fp.ignore_disruptions_rule() not in rules_of(out)
    assert any(
        "ignore-disruptions (cluster default) skipped: your spec.podFailurePolicy.rules[0]" in w
        for w in verdict.warnings
    )


def test_only_a_mix_of_codes_may_reach_the_counting_rule():
    # Each uniform pod (every container 143, or every container 137) is ignored by the
    # user's first two rules; main SIGTERMed while the sidecar is SIGKILLed is not.
    user = [
        {
            "action": "Ignore",
            "onExitCodes": {"containerName": "main", "operator": "In", "values": [137]},
        },
        {
            "action": "Ignore",
            "onExitCodes": {"containerName": "logger", "operator": "In", "values": [143]},
        },
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [137, 143]}},
    ]
    obj = sidecar_job(
        {P + "ignore-disruptions": "true"}, spec={"podFailurePolicy": {"rules": user}}
    )
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "rules[2] (Count) matches a disrupted pod first" in verdict.message


@pytest.mark.parametrize(
    "user",
    [
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [1, 2]}},
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137, 143]}},
    ],
)
def test_user_rules_a_disrupted_pod_cannot_match_are_kept(user):
    obj = sidecar_job(
        {P + "ignore-disruptions": "true"}, spec={"podFailurePolicy": {"rules": [user]}}
    )
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    assert rules_of(out) == [user, fp.ignore_disruptions_rule()]


def test_disrupted_pods_cover_every_running_container():
    spec = sidecar_job()["spec"]["template"]["spec"]
    pods = list(fp.disrupted_pods(spec))
    # main, logger and the sidecar proxy: 2**3 combinations; setup (a finished init
    # container) only as a pod disrupted during its init phase: 2 more.
    assert len(pods) == 8 + 2
    assert all(DISRUPTED in p.conditions for p in pods)
    names = {tuple(e.name for e in p.exits) for p in pods}
    assert names == {("main", "logger", "proxy"), ("setup",)}
    wide = {"containers": [{"name": f"c{i}"} for i in range(9)]}
    assert len(list(fp.disrupted_pods(wide))) == 2 + 2 * 9  # uniform, then one apart


def test_explain_refuses_the_defeated_ignore_with_the_reason(tmp_path):
    count_137 = {"action": "Count", "onExitCodes": {"operator": "In", "values": [137]}}
    obj = manifest({P + "ignore-disruptions": "true"})
    obj["spec"]["podFailurePolicy"] = {"rules": [count_137]}
    path = write(tmp_path, obj)
    code, out, _ = run(["explain", "-f", str(path), "--simulate", "disruption+main:137"])
    assert code == 1
    assert "matches a disrupted pod first (container main stopped with 137)" in " ".join(
        out.split()
    )


def test_explain_counts_a_disrupted_pod_killed_after_its_grace_period(tmp_path):
    # upstream: matchPodFailurePolicy stops at the first matching rule. Without
    # ignore-disruptions, a preempted pod SIGKILLed after its grace period (137) would
    # match the FailJob rule (retriable 143 only) and fail the Job for a preemption; the
    # Count rule on DisruptionTarget before it counts the pod as a retriable failure.
    item = one(manifest({P + "fail-non-retriable": "true"}), events="disruption+main:137")
    assert (
        "pod disrupted (preemption, eviction, drain; main exits 137): rule 1 matches; "
        "retried, counts against backoffLimit (Count)"
    ) in item.examples
    assert item.rules[0].origin == "added by retry-policy for fail-non-retriable"
    (step,) = item.simulation.steps
    assert (step.rule, step.action, step.counted) == (1, "Count", True)
    assert item.simulation.ending.state == "Running"
    # An application error still fails the Job at once, through the rule after it.
    item = one(manifest({P + "fail-non-retriable": "true"}), events="1")
    assert item.simulation.steps[0].action == "FailJob"
    assert item.simulation.ending.reason == "PodFailurePolicy"
    # The CLI tells the same story: disruptions (SIGKILLed, or exit 1 on SIGTERM) use up
    # the budget, and the Job ends by backoffLimit, not PodFailurePolicy.
    obj = manifest({P + "fail-non-retriable": "true", P + "backoff-limit": "1"})
    path = write(tmp_path, obj)
    code, out, err = run(
        ["explain", "-f", str(path), "--simulate", "disruption+main:137,disruption+main:1"]
    )
    assert code == 0, err
    text = " ".join(out.split())
    assert (
        "main exits 137). Rule 1 (Count): counted (1 of 1 allowed failures used); next: "
        "attempt 2, on any node."
    ) in text
    assert "main exits 1). Rule 1 (Count): counted, more than backoffLimit 1." in text
    assert "Outcome: the Job fails; condition Failed, reason BackoffLimitExceeded" in text


# --- 4b. fail-non-retriable without ignore-disruptions counts a disrupted pod -------------

COUNT_ADDED = (
    "retry-policy: added podFailurePolicy rule Count on DisruptionTarget (fail-non-retriable)"
)


def test_matchPodFailurePolicy_the_count_rule_precedes_a_copy_of_our_failjob_rule():
    """upstream: matchPodFailurePolicy stops at the first match. A manifest copied from a
    Job an earlier version mutated (``kubectl get -o yaml``) already holds our FailJob
    rule; the Count rule added now must still come before it, or a preempted pod that
    exits 137 matches the FailJob copy first and fails the Job."""
    copied = fp.non_retriable_rule([143], "FailJob", "main")
    own = {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [75]}}
    spec = {"podFailurePolicy": {"rules": [own, copied]}}
    verdict, out = mutate(job({P + "fail-non-retriable": "true"}, spec=spec))
    assert verdict.allowed, verdict.message
    assert rules_of(out) == [own, fp.count_disruptions_rule(), copied]
    status = failed_pod_status(containers=[("main", 137)], conditions=[DISRUPTED])
    match = fp.evaluate(rules_of(out), PodFailure.from_pod(status))
    assert match is not None and match.action == "Count"
    assert mutate(out)[0].patch == []


def test_matchPodFailurePolicy_counts_a_preempted_pod_before_the_failjob_rules(tmp_path):
    """upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go) stops at
    the first rule that matches. A preempted, evicted or drained pod has
    DisruptionTarget=True and its containers stopped by SIGTERM (143) or, after the grace
    period, SIGKILL (137), or by an application that exits 1 on SIGTERM. Without
    ignore-disruptions, such a pod matched FailJob NotIn [143] and failed the Job for a
    preemption; the Count rule on the condition, first, counts it and retries it."""
    obj = sidecar_job({P + "fail-non-retriable": "true", P + "backoff-limit": "3"})
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    rules = rules_of(out)
    assert rules[0] == fp.count_disruptions_rule()
    assert verdict.warnings[1:3] == [
        COUNT_ADDED,
        "retry-policy: added podFailurePolicy rules FailJob on exit codes NotIn [143] in "
        "main, logger, setup (fail-non-retriable)",
    ]
    assert len(COUNT_ADDED) < 120
    record = json.loads(out["metadata"]["annotations"][P + "applied"])
    ours = ",".join(sorted(rule_id(rule) for rule in rules))  # every rule is the webhook's
    assert record == {
        "backoffLimit": 3,
        "countDisruptions": True,
        "failNonRetriable": [143],
        "origins": {"fail-non-retriable": ours},
        "v": 2,
    }
    assert kubectl_patch(obj, verdict.patch, tmp_path) == out
    validate_schema(out)
    for failure in fp.disrupted_pods(out["spec"]["template"]["spec"]):
        match = fp.evaluate(rules, failure)
        assert match is not None and (match.index, match.action) == (0, "Count")
    # As the kubelet reports them: SIGKILLed after the grace period; exit 1 on SIGTERM.
    for containers in ([("main", 137), ("logger", 137)], [("main", 1), ("logger", 143)]):
        status = failed_pod_status(
            containers=containers, init=[("proxy", 137)], conditions=[DISRUPTED]
        )
        match = fp.evaluate(rules, PodFailure.from_pod(status))
        assert match is not None and match.action == "Count"
        # The rules without it (this project's before) failed the Job for a preemption.
        before = fp.evaluate(rules[1:], PodFailure.from_pod(status))
        assert before is not None and before.action == "FailJob"
    # An application's own error still fails the Job at once.
    match = fp.evaluate(rules, PodFailure.from_pod(failed_pod_status(containers=[("main", 1)])))
    assert match is not None and match.action == "FailJob"
    again, twice = mutate(out)
    assert again.patch == [] and again.warnings == [] and twice == out
    assert validate(out).allowed


@pytest.mark.parametrize(
    ("user", "counted"),
    [
        ({"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}, False),
        (
            {
                "action": "FailJob",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            False,
        ),
        # Never matches a disrupted pod: ours is still needed after it.
        (
            {
                "action": "Count",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "False"}],
            },
            True,
        ),
        # A pod that exits 1 on SIGTERM gets past it to our FailJob rule.
        ({"action": "Count", "onExitCodes": {"operator": "In", "values": [137]}}, True),
    ],
)
def test_matchOnPodConditions_a_users_rule_on_disruptions_decides(user, counted):
    """upstream: matchOnPodConditions matches a pattern on type and status (True unless
    written: SetDefaults_PodFailurePolicyOnPodConditionsPattern). A rule of yours that
    takes DisruptionTarget=True pods decides what a disruption does, and our Count rule
    after it would never match: it is not added, nor recorded."""
    obj = job({P + "fail-non-retriable": "true"}, spec={"podFailurePolicy": {"rules": [user]}})
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    ours = [fp.non_retriable_rule([143], "FailJob", "main")]
    if counted:
        ours.insert(0, fp.count_disruptions_rule())
    assert rules_of(out)[1:] == ours
    assert (COUNT_ADDED in verdict.warnings) is counted
    record = json.loads(out["metadata"]["annotations"][P + "applied"])
    assert ("countDisruptions" in record) is counted
    assert mutate(out)[0].patch == []


def test_validatePodFailurePolicy_counts_the_count_rule_among_the_twenty():
    """upstream: validatePodFailurePolicy (pkg/apis/batch/validation) refuses more than
    20 rules. fail-non-retriable needs its Count rule before its exit-code rules, so
    both fit or neither is added: annotated, it is denied; from a default, skipped."""
    annotated = {P + "fail-non-retriable": "true"}
    verdict, _ = mutate(job(annotated, spec={"podFailurePolicy": {"rules": count_rules(19)}}))
    assert not verdict.allowed
    assert (
        f"annotation {P}fail-non-retriable: spec.podFailurePolicy would have 21 rules (19 "
        "yours, 2 added); Kubernetes allows at most 20"
    ) in verdict.message
    verdict, out = mutate(job(annotated, spec={"podFailurePolicy": {"rules": count_rules(18)}}))
    assert verdict.allowed, verdict.message
    assert rules_of(out)[18:] == [
        fp.count_disruptions_rule(),
        fp.non_retriable_rule([143], "FailJob", "main"),
    ]
    config = parse_config("defaults: {fail-non-retriable: true}")
    verdict, out = mutate(job(spec={"podFailurePolicy": {"rules": count_rules(19)}}), config)
    assert verdict.allowed, verdict.message
    assert rules_of(out) == count_rules(19)
    assert any(
        "fail-non-retriable (cluster default) skipped: spec.podFailurePolicy would have 21 "
        "rules (19 yours, 2 added)" in w
        for w in verdict.warnings
    )
    # With ignore-disruptions its Ignore rule takes the place of the Count rule.
    both = {**annotated, P + "ignore-disruptions": "true"}
    verdict, out = mutate(job(both, spec={"podFailurePolicy": {"rules": count_rules(18)}}))
    assert verdict.allowed, verdict.message
    assert rules_of(out)[18] == fp.ignore_disruptions_rule()


def old_replicas_job(out):
    """``out`` as a replica that did not add the Count rule yet would have mutated it."""
    old = copy.deepcopy(out)
    old["spec"]["podFailurePolicy"]["rules"].remove(fp.count_disruptions_rule())
    record = json.loads(old["metadata"]["annotations"][P + "applied"])
    del record["countDisruptions"]
    old["metadata"]["annotations"][P + "applied"] = json.dumps(record, separators=(",", ":"))
    return old


def test_engine_unapplied_does_not_require_the_count_rule_in_an_upgrade():
    """engine._unapplied denies an annotated policy missing from the object. While the
    webhook's replicas are upgraded, an old one may mutate a Job and a new one validate
    it: the Count rule it lacks is not required (podFailurePolicy is immutable, so the
    Job could never get it), what it has is."""
    _, out = mutate(job({P + "fail-non-retriable": "true"}))
    assert rules_of(out)[0] == fp.count_disruptions_rule()
    old = old_replicas_job(out)
    assert validate(old).allowed
    missing = copy.deepcopy(out)
    del missing["spec"]["podFailurePolicy"]["rules"][1]
    verdict = validate(missing)
    assert not verdict.allowed
    assert "was not applied (added podFailurePolicy rule FailJob" in verdict.message


# --- 4c. ignored disruptions never end a Job: a deadline must --------------------------


def test_pastActiveDeadline_is_all_that_ends_a_job_whose_disruptions_are_ignored():
    """upstream: matchPodFailurePolicy gives an Ignore match countFailed false, so such a
    failure never reaches status.failed nor backoffLimit; only pastActiveDeadline
    (pkg/controller/job/job_controller.go) ends a Job preempted again and again. Where
    our Ignore rule goes into a spec without activeDeadlineSeconds, a warning names it."""
    want = "retry-policy: set spec.activeDeadlineSeconds: ignored disruptions retry with no cap"
    verdict, out = mutate(job({P + "ignore-disruptions": "true"}))
    assert want in verdict.warnings
    assert mutate(out)[0].warnings == []  # a reinvocation adds nothing and says nothing
    verdict, _ = mutate(job(spec={"activeDeadlineSeconds": 3600}), DEFAULTS)
    assert verdict.allowed and not any("activeDeadlineSeconds" in w for w in verdict.warnings)
    verdict, _ = mutate(job(), DEFAULTS)  # from an admin default too
    assert want in verdict.warnings
    verdict, _ = mutate(cronjob({P + "ignore-disruptions": "true"}))
    assert (
        "retry-policy: set spec.jobTemplate.spec.activeDeadlineSeconds: ignored disruptions "
        "retry with no cap"
    ) in verdict.warnings
    # A JobSet: each replicated Job's own deadline (a JobSet has none of its own).
    jobs = [
        replicated("leader", restart_policy="Never", activeDeadlineSeconds=3600),
        replicated("workers", restart_policy="Never"),
    ]
    verdict, _ = mutate(jobset({P + "ignore-disruptions": "true"}, jobs=jobs))
    deadlines = [w for w in verdict.warnings if "activeDeadlineSeconds" in w]
    assert deadlines == [
        "retry-policy: set spec.replicatedJobs[1].template.spec.activeDeadlineSeconds: ignored "
        "disruptions retry with no cap"
    ]
    assert all(len(w) < 120 for w in verdict.warnings), verdict.warnings


# --- 5. one failed pod at a time ---------------------------------------------------------


def masked_job():
    """Retriable 137 and 143, and the user's rules: Count on 143, then FailJob on 137."""
    user = [
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [143]}},
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [137]}},
    ]
    return job(
        {P + "fail-non-retriable": "true", P + "retriable-exit-codes": "137,143"},
        spec={"podFailurePolicy": {"rules": user}},
    )


def test_a_failing_rule_masked_by_an_earlier_counting_rule_is_found():
    # upstream: matchPodFailurePolicy judges each failed pod on its own: a pod that
    # exits 137 passes the first rule (In [143]) and is failed by the second.
    verdict, _ = mutate(masked_job())
    assert not verdict.allowed
    assert (
        "your spec.podFailurePolicy.rules[1] (FailJob) matches a pod whose container main "
        "exited 137, which retriable-exit-codes (137,143) says to retry"
    ) in verdict.message


def test_a_failing_rule_for_one_container_is_found_per_container():
    user = [
        {
            "action": "Count",
            "onExitCodes": {"containerName": "main", "operator": "In", "values": [143]},
        },
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [143]}},
    ]
    verdict, _ = mutate(
        sidecar_job({P + "fail-non-retriable": "true"}, spec={"podFailurePolicy": {"rules": user}})
    )
    assert not verdict.allowed
    assert "rules[1] (FailJob) matches a pod whose container logger exited 143" in (verdict.message)


def test_a_users_own_rule_on_a_sidecar_code_is_theirs():
    user = {
        "action": "FailJob",
        "onExitCodes": {"containerName": "proxy", "operator": "In", "values": [143]},
    }
    verdict, out = mutate(
        sidecar_job(
            {P + "fail-non-retriable": "true"}, spec={"podFailurePolicy": {"rules": [user]}}
        )
    )
    assert verdict.allowed, verdict.message
    assert rules_of(out)[0] == user


# --- 7. an admin default never pushes a valid Job past 20 rules ---------------------------


def count_rules(n):
    return [
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [code]}}
        for code in range(1, n + 1)
    ]


@pytest.mark.parametrize("own", [19, 20])
def test_defaults_past_twenty_rules_are_skipped_not_denied(own):
    # upstream: validatePodFailurePolicy (pkg/apis/batch/validation) refuses more than
    # maxPodFailurePolicyRules = 20 rules; a Job with its own 19 or 20 is valid.
    obj = job(spec={"podFailurePolicy": {"rules": count_rules(own)}})
    verdict, out = mutate(obj, DEFAULTS)
    assert verdict.allowed, verdict.message
    assert validate(obj, DEFAULTS).allowed
    assert len(rules_of(out)) <= 20
    assert any(
        "fail-non-retriable (cluster default) skipped: spec.podFailurePolicy would have" in w
        for w in verdict.warnings
    )
    # With 19 of yours, Ignore still fits (the last-added default is skipped first).
    assert (fp.ignore_disruptions_rule() in rules_of(out)) is (own == 19)


def test_an_annotated_setting_keeps_its_rules_and_the_default_makes_room():
    obj = job(
        {P + "ignore-disruptions": "true"},
        spec={"podFailurePolicy": {"rules": count_rules(19)}},
    )
    verdict, out = mutate(obj, DEFAULTS)
    assert verdict.allowed, verdict.message
    assert rules_of(out)[-1] == fp.ignore_disruptions_rule()
    assert fp.non_retriable_rule([143], "FailJob", "main") not in rules_of(out)
    assert any("fail-non-retriable (cluster default) skipped" in w for w in verdict.warnings)


def test_jobset_and_cronjob_templates_past_twenty_rules_are_skipped_not_denied():
    full = {"podFailurePolicy": {"rules": count_rules(20)}}
    jobs = [replicated("workers", restart_policy="Never", **full)]
    verdict, out = mutate(jobset(jobs=jobs), DEFAULTS)
    assert verdict.allowed, verdict.message
    assert rules_of(out, ("spec", "replicatedJobs", 0, "template", "spec")) == count_rules(20)
    assert "retryPolicyFailNonRetriable" not in json.dumps(out["spec"].get("failurePolicy"))
    verdict, out = mutate(cronjob(job_spec=full), DEFAULTS)
    assert verdict.allowed, verdict.message
    assert rules_of(out, ("spec", "jobTemplate", "spec")) == count_rules(20)


def test_explain_says_the_default_was_skipped(tmp_path):
    obj = manifest(namespace="ml", spec={"podFailurePolicy": {"rules": count_rules(20)}})
    path = write(tmp_path, obj)
    config = tmp_path / "config.yaml"
    config.write_text("defaults: {fail-non-retriable: true, ignore-disruptions: true}")
    code, out, err = run(["explain", "-f", str(path), "--config", str(config)])
    assert code == 0, err
    text = " ".join(out.split())
    assert (
        "ignore-disruptions (cluster default) skipped: spec.podFailurePolicy would have 21 "
        "rules (20 yours, 1 added); Kubernetes allows at most 20"
    ) in text
    assert "fail-non-retriable (cluster default) skipped" in text


# --- 8. workloads made by other controllers keep their own retry behaviour --------------

RAYJOB_OWNER = {
    "apiVersion": "ray.io/v1",
    "kind": "RayJob",
    "name": "tune",
    "uid": "rayjob-uid",
    "controller": True,
    "blockOwnerDeletion": True,
}


def submitter_job():
    """KubeRay's submitter Job: backoffLimit 2 so that ``ray job submit`` is tried three
    times, and a controller reference to its RayJob (ray-operator's rayjob_controller.go,
    ``ctrl.SetControllerReference`` when it creates the Job)."""
    obj = job(spec={"backoffLimit": 2})
    obj["metadata"]["name"] = "tune"
    obj["metadata"]["labels"] = {"ray.io/originated-from-crd": "RayJob"}
    obj["metadata"]["ownerReferences"] = [RAYJOB_OWNER]
    return obj


def test_defaults_and_guard_rails_leave_a_controllers_job_alone():
    config = parse_config(
        "defaults: {fail-non-retriable: true, backoff-limit: 1}\nguardRails: {maxBackoffLimit: 1}"
    )
    obj = submitter_job()
    verdict, out = mutate(obj, config)
    assert verdict.allowed and verdict.patch == [] and out == obj
    assert validate(obj, config).allowed
    # The same Job written by a person gets them (and its backoffLimit 2 is over the rail).
    mine = copy.deepcopy(obj)
    del mine["metadata"]["ownerReferences"]
    assert not validate(mine, config).allowed
    mine["spec"]["backoffLimit"] = 6
    verdict, out = mutate(mine, config)
    assert verdict.allowed and out["spec"]["backoffLimit"] == 1 and rules_of(out)


def test_annotations_on_a_controllers_job_still_count():
    obj = submitter_job()
    obj["metadata"]["annotations"] = {P + "ignore-disruptions": "true"}
    verdict, out = mutate(obj, DEFAULTS)
    assert verdict.allowed, verdict.message
    assert rules_of(out) == [fp.ignore_disruptions_rule()]  # not the default's FailJob
    assert "podFailurePolicy" in out["spec"] and out["spec"]["backoffLimit"] == 2


@pytest.mark.parametrize(
    "owner",
    [
        # Kubeflow Trainer v2: a TrainJob's JobSet (its jobset plugin's
        # SetControllerReference).
        {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob"},
        # The MPI operator's launcher Job (newLauncherJob: NewControllerRef).
        {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob"},
    ],
)
def test_defaults_leave_jobsets_and_jobs_of_other_operators_alone(owner):
    ref = {**owner, "name": "x", "uid": "owner-uid", "controller": True}
    for obj in (jobset(), job()):
        obj["metadata"]["ownerReferences"] = [ref]
        verdict, out = mutate(obj, DEFAULTS)
        assert verdict.allowed and verdict.patch == [] and out == obj, obj["kind"]


def test_an_owner_that_is_not_the_controller_does_not_count():
    obj = job()
    obj["metadata"]["ownerReferences"] = [{**RAYJOB_OWNER, "controller": False}]
    verdict, out = mutate(obj, DEFAULTS)
    assert verdict.allowed and rules_of(out)


def test_explain_says_why_defaults_do_not_apply(tmp_path):
    path = write(tmp_path, submitter_job())
    config = tmp_path / "config.yaml"
    config.write_text("defaults: {fail-non-retriable: true}")
    code, out, err = run(["explain", "-f", str(path), "--config", str(config)])
    assert code == 0, err
    text = " ".join(out.split())
    assert "this Job is managed by RayJob tune: the cluster's defaults and guard rails do not" in (
        text
    )
    assert "FailJob" not in text  # no rule was added


# --- 9. restartPolicy OnFailure makes no new pod -------------------------------------------


def test_non_spot_attempts_on_an_on_failure_job_is_denied_or_skipped():
    # upstream: pastBackoffLimitOnFailure (pkg/controller/job/job_controller.go) counts
    # the container restarts of running pods; the kubelet restarts the container in the
    # same pod, so no pod is created for a later attempt and nothing can place it.
    annotated = job(
        {P + "non-spot-attempts": "1", P + "backoff-limit": "3"}, restart_policy="OnFailure"
    )
    verdict, _ = mutate(annotated)
    assert not verdict.allowed
    assert (
        "annotation retry-policy.dev/non-spot-attempts: spec.template.spec.restartPolicy is "
        "OnFailure: non-spot-attempts acts on the new pod of a later attempt, and under "
        "OnFailure a failed container restarts in the same pod"
    ) in verdict.message
    verdict, out = mutate(job(restart_policy="OnFailure"), DEFAULTS)
    assert verdict.allowed, verdict.message
    assert "annotations" not in out["spec"]["template"].get("metadata", {})
    assert any("non-spot-attempts (cluster default) skipped" in w for w in verdict.warnings)
    assert not any("non-spot nodes" in w for w in verdict.warnings if "skipped" not in w)


def test_non_spot_attempts_on_an_on_failure_cronjob_template_is_denied():
    obj = cronjob({P + "non-spot-attempts": "1"})
    obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "spec.jobTemplate.spec.template.spec.restartPolicy is OnFailure" in verdict.message


def test_a_jobsets_on_failure_children_are_placed_by_run():
    # JobSet's own webhook defaults an unset restartPolicy to OnFailure; its pods are
    # still new in every run (restart-attempt), which is what placement counts.
    verdict, out = mutate(jobset({P + "non-spot-attempts": "1", P + "backoff-limit": "2"}))
    assert verdict.allowed, verdict.message
    assert child(out, 0)["template"]["metadata"]["annotations"][P + "non-spot-attempts"] == "1"


def test_explain_denies_non_spot_attempts_with_on_failure(tmp_path):
    obj = manifest({P + "non-spot-attempts": "1"})
    obj["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    code, out, _ = run(["explain", "-f", str(write(tmp_path, obj)), "--simulate", "1,1"])
    assert code == 1
    assert "under OnFailure a failed container restarts in the same pod" in " ".join(out.split())


# --- 10. a budget changed by UPDATE ---------------------------------------------------------


def updated(obj, **spec):
    new = copy.deepcopy(obj)
    new["spec"].update(spec)
    return new


def test_lowering_backoff_limit_against_the_annotation_is_denied():
    # upstream: ValidateJobSpecUpdate leaves spec.backoffLimit mutable (backoffLimitPerIndex
    # and podFailurePolicy are immutable), and exceedsBackoffLimit in syncJob reads the
    # Job's current spec.backoffLimit.
    _, old = mutate(job({P + "backoff-limit": "3", P + "non-spot-attempts": "1"}))
    verdict = validate(updated(old, backoffLimit=1), operation="UPDATE", old=old)
    assert not verdict.allowed
    assert (
        "annotation retry-policy.dev/backoff-limit: 3 contradicts spec.backoffLimit: 1 "
        "(changed from 3); change the annotation with it, or remove the annotation"
    ) in verdict.message
    # Changed together, the update is allowed, and says where the last attempt now runs.
    both = updated(old, backoffLimit=1)
    both["metadata"]["annotations"][P + "backoff-limit"] = "1"
    verdict = validate(both, operation="UPDATE", old=old)
    assert verdict.allowed, verdict.message
    assert verdict.warnings == [
        "retry-policy: spec.backoffLimit 3 -> 1: the Job's next pods place the last 1 of 2 "
        "attempts on non-spot nodes"
    ]


def test_a_budget_below_the_annotated_non_spot_attempts_is_denied():
    _, old = mutate(job({P + "non-spot-attempts": "3"}))
    verdict = validate(updated(old, backoffLimit=1), operation="UPDATE", old=old)
    assert not verdict.allowed
    assert (
        "annotation retry-policy.dev/non-spot-attempts: 3 is more than the 2 attempts "
        "spec.backoffLimit 1 + 1 allows"
    ) in verdict.message
    # From a default it is allowed, and every attempt goes to non-spot nodes.
    _, old = mutate(job(), parse_config("defaults: {non-spot-attempts: 3}"))
    verdict = validate(updated(old, backoffLimit=1), operation="UPDATE", old=old)
    assert verdict.allowed
    assert verdict.warnings == [
        "retry-policy: spec.backoffLimit 6 -> 1: every attempt will run on non-spot nodes"
    ]


@pytest.mark.parametrize(
    ("build", "path", "where"),
    [
        (rayjob, ("spec", "backoffLimit"), "spec.backoffLimit"),
        (pytorchjob, ("spec", "runPolicy", "backoffLimit"), "spec.runPolicy.backoffLimit"),
    ],
)
def test_a_rayjob_or_pytorchjob_budget_changed_against_the_annotation_is_denied(build, path, where):
    _, old = mutate(build({P + "backoff-limit": "2"}))
    new = copy.deepcopy(old)
    target = new
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = 0
    verdict = validate(new, operation="UPDATE", old=old)
    assert not verdict.allowed
    assert f"2 contradicts {where}: 0 (changed from 2)" in verdict.message
    # Without the annotation there is nothing to contradict.
    del new["metadata"]["annotations"][P + "backoff-limit"]
    del old["metadata"]["annotations"][P + "backoff-limit"]
    assert validate(new, operation="UPDATE", old=old).allowed


class LiveBudget(NoCluster):
    """The attempt cache's answer for a Job whose backoffLimit was lowered to 1."""

    def __init__(self, failures, budget):
        self.answer = AttemptLookup(failures, "Job status (cache)", budget=budget)

    def job_failures(self, namespace, name, uid):
        return self.answer

    def stats(self):
        return {}


@pytest.mark.parametrize(("failures", "budget", "non_spot"), [(1, 1, True), (1, 3, False)])
def test_pods_are_placed_by_the_jobs_current_backoff_limit(failures, budget, non_spot):
    # The template says backoff-limit 3 (written at creation); the Job's backoffLimit is
    # now 1: its second attempt (1 failure so far) is its last, so it runs on non-spot
    # nodes (upstream: exceedsBackoffLimit := jobCtx.failed > *job.Spec.BackoffLimit).
    obj = pod({P + "backoff-limit": "3", P + "non-spot-attempts": "1"}, owner=job_owner())
    request = json.loads(json.dumps(review(obj)))
    from webhook.admission import engine
    from webhook.admission import review as admission
    from webhook.policy.config import Config

    verdict = engine.mutate(
        admission.decode(json.dumps(request)), Config(), LiveBudget(failures, budget)
    )
    out = apply(obj, verdict.patch)
    terms = (
        out["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms")
    )
    assert (terms == [{"matchExpressions": NON_SPOT}]) is non_spot
    if non_spot:
        assert f"attempt 2 of {budget + 1}" in verdict.warnings[0]


def test_the_attempt_cache_keeps_the_budget_of_jobs_placed_by_it():
    template = {"metadata": {"annotations": {P + "non-spot-attempts": "1"}}}
    placed = {"spec": {"backoffLimit": 1, "template": template}}
    assert placement_budget(placed) == 1
    assert placement_budget({"spec": {"backoffLimit": 1}}) is None  # no placement
    per_index = {"spec": {"backoffLimit": 9, "backoffLimitPerIndex": 1, "template": template}}
    assert placement_budget(per_index) is None


def test_the_attempt_cache_follows_a_changed_backoff_limit():
    from testkit.attempts import cache_for, eventually, lookup, make_job

    api = FakeAPI().start()
    try:
        job_obj = make_job("train", failed=1)
        job_obj["spec"] = {
            "backoffLimit": 3,
            "template": {"metadata": {"annotations": {P + "non-spot-attempts": "1"}}},
        }
        api.put("jobs", job_obj)
        cache = cache_for(api)
        try:
            assert lookup(cache, job_obj).budget == 3
            assert eventually(lambda: api.watcher_count("jobs") == 1)
            job_obj["spec"]["backoffLimit"] = 1
            api.put("jobs", job_obj)
            assert eventually(lambda: lookup(cache, job_obj).budget == 1)
        finally:
            cache.stop()
    finally:
        api.stop()


# --- 11. an empty node selector term matches no node ---------------------------------------


def test_an_empty_term_is_left_empty():
    # upstream: isEmptyNodeSelectorTerm (k8s.io/component-helpers/scheduling/corev1/
    # nodeaffinity): a term without matchExpressions and matchFields selects no node.
    spot = parse_config("{}").spot_node_labels
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    name = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": []},
                        {},
                        {"matchExpressions": [zone]},
                        {"matchFields": [name]},
                    ]
                }
            }
        }
    }
    assert add_non_spot_affinity(spec, spot)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": []},
        {},
        {"matchExpressions": [zone, *NON_SPOT]},
        {"matchFields": [name], "matchExpressions": NON_SPOT},
    ]
    only_empty = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": []}]
                }
            }
        }
    }
    before = copy.deepcopy(only_empty)
    assert not add_non_spot_affinity(only_empty, spot) and only_empty == before


def test_an_empty_term_does_not_hide_a_spot_pin():
    spot = parse_config("{}").spot_node_labels
    pin = {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": []}, {"matchExpressions": [pin]}]
                }
            }
        }
    }
    assert requires_spot(spec, spot) == (
        "required node affinity karpenter.sh/capacity-type In ['spot']"
    )
    verdict, _ = mutate(
        job({P + "non-spot-attempts": "1"}, spec={"template": {"spec": {**spec, **SPEC}}})
    )
    assert not verdict.allowed and "requires spot nodes" in verdict.message


SPEC = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36"}]}


# --- the real server, as deployed ----------------------------------------------------------

SERVER_CONFIG = """\
namespaces:
  defaulted:
    defaults:
      fail-non-retriable: true
      ignore-disruptions: true
      non-spot-attempts: 1
"""


@pytest.fixture(scope="module")
def cluster():
    api = FakeAPI().start()
    yield api
    api.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, cluster):
    tmp = tmp_path_factory.mktemp("semantics")
    (tmp / "config.yaml").write_text(SERVER_CONFIG)
    write_kubeconfig(tmp / "kubeconfig", cluster.url)
    srv = start(
        tmp / "certs",
        "--config",
        str(tmp / "config.yaml"),
        "--kube",
        "kubeconfig",
        env={"KUBECONFIG": str(tmp / "kubeconfig")},
    )
    yield srv
    stop(srv)


def answer(server, path, obj, **kw):
    body = server.review(path, review(obj, **kw))
    assert "response" in body, body
    return body["response"]


def patched(obj, response):
    return apply(obj, decode_patch({"response": response}))


def in_namespace(obj, namespace):
    obj["metadata"]["namespace"] = namespace
    return obj


def test_server_names_containers_and_leaves_sidecars_out(server):
    obj = sidecar_job({P + "fail-non-retriable": "true"})
    response = answer(server, "/mutate", obj)
    out = patched(obj, response)
    assert rules_of(out)[0] == fp.count_disruptions_rule()
    assert [r["onExitCodes"]["containerName"] for r in rules_of(out)[1:]] == [
        "main",
        "logger",
        "setup",
    ]
    assert answer(server, "/validate", out)["allowed"] is True


def test_server_counts_disruptions_and_accepts_a_job_mutated_without_it(server):
    """Through the server as deployed: /mutate puts the Count rule on DisruptionTarget
    first (matchPodFailurePolicy), /validate accepts a Job that a replica without it
    mutated (engine._unapplied)."""
    obj = job({P + "fail-non-retriable": "true"})
    response = answer(server, "/mutate", obj)
    out = patched(obj, response)
    assert rules_of(out)[0] == fp.count_disruptions_rule()
    assert response["warnings"][0].startswith("retry-policy: 3 changes made: ")  # one line
    assert answer(server, "/validate", out)["allowed"] is True
    assert answer(server, "/validate", old_replicas_job(out))["allowed"] is True


def test_server_warns_of_ignored_disruptions_without_a_deadline(server):
    """A Job of a namespace whose defaults ignore disruptions, without a deadline, is
    told to set one: only pastActiveDeadline would end it."""
    response = answer(server, "/mutate", in_namespace(job(), "defaulted"))
    assert (
        "retry-policy: set spec.activeDeadlineSeconds: ignored disruptions retry with no cap"
        in response["warnings"]
    )


def test_server_denies_a_defeated_ignore_and_a_masked_failing_rule(server):
    count_137 = {"action": "Count", "onExitCodes": {"operator": "In", "values": [137]}}
    obj = job({P + "ignore-disruptions": "true"}, spec={"podFailurePolicy": {"rules": [count_137]}})
    response = answer(server, "/validate", obj)
    assert response["allowed"] is False
    assert "matches a disrupted pod first" in response["status"]["message"]
    response = answer(server, "/mutate", masked_job())
    assert response["allowed"] is False
    assert (
        "rules[1] (FailJob) matches a pod whose container main exited 137"
        in (response["status"]["message"])
    )


def test_server_skips_defaults_that_cannot_apply(server):
    # 20 rules of your own: the defaults are skipped, the Job admitted.
    full = in_namespace(job(spec={"podFailurePolicy": {"rules": count_rules(20)}}), "defaulted")
    response = answer(server, "/mutate", full)
    assert response["allowed"] is True
    assert rules_of(patched(full, response)) == count_rules(20)
    assert answer(server, "/validate", full)["allowed"] is True
    # restartPolicy OnFailure: non-spot-attempts (like the rules) skipped.
    on_failure = in_namespace(job(restart_policy="OnFailure"), "defaulted")
    response = answer(server, "/mutate", on_failure)
    assert response["allowed"] is True and "patch" not in response
    assert any("non-spot-attempts (namespace default" in w for w in response["warnings"])
    assert all(len(w) <= 256 for w in response["warnings"])
    # KubeRay's submitter Job: left alone.
    submitter = in_namespace(submitter_job(), "defaulted")
    response = answer(server, "/mutate", submitter)
    assert response == {"uid": response["uid"], "allowed": True}


def test_server_denies_a_budget_update_against_the_annotation(server):
    _, old = mutate(job({P + "backoff-limit": "3"}))
    response = answer(
        server, "/validate", updated(old, backoffLimit=1), operation="UPDATE", old=old
    )
    assert response["allowed"] is False
    assert "3 contradicts spec.backoffLimit: 1 (changed from 3)" in response["status"]["message"]


def test_server_places_by_the_live_budget_from_the_cluster(server, cluster):
    # The Job's backoffLimit was lowered from 3 to 1 after its pods' template said 3; it
    # has failed once: its next pod is its last attempt.
    job_obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "lowered", "namespace": "ml", "uid": "uid-lowered"},
        "spec": {
            "backoffLimit": 1,
            "template": {
                "metadata": {
                    "annotations": {P + "backoff-limit": "3", P + "non-spot-attempts": "1"}
                }
            },
        },
        "status": {"failed": 1},
    }
    cluster.put("jobs", job_obj)
    obj = pod(
        {P + "backoff-limit": "3", P + "non-spot-attempts": "1"},
        owner=job_owner("lowered", "uid-lowered"),
    )
    response = eventually(lambda: (r := answer(server, "/mutate", obj)).get("patch") and r, 5)
    out = patched(obj, response)
    terms = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": NON_SPOT}]
    assert any("attempt 2 of 2 (1 failures so far" in w for w in response["warnings"])


def test_server_leaves_an_empty_term_empty(server):
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": []},
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    ]
                }
            }
        }
    }
    obj = pod(
        {P + "backoff-limit": "1", P + "non-spot-attempts": "1", P + "attempt": "1"}, spec=spec
    )
    response = answer(server, "/mutate", obj)
    out = patched(obj, response)
    terms = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0] == {"matchExpressions": []}
    assert terms[1]["matchExpressions"][1:] == NON_SPOT


# --- what the README says of the API server and the CronJob controller --------------------


def test_the_dry_run_defaults_are_set_defaults_job():
    # upstream: SetDefaults_Job and SetDefaults_PodFailurePolicyOnPodConditionsPattern
    # (pkg/apis/batch/v1/defaults.go): what a Job has when a webhook first sees it.
    from webhook.kube import defaulting as defaults

    plain = {"spec": {"template": {"spec": {"containers": []}}}}
    defaults.default_job(plain)
    assert {k: plain["spec"][k] for k in ("backoffLimit", "podReplacementPolicy")} == {
        "backoffLimit": 6,
        "podReplacementPolicy": "TerminatingOrFailed",
    }
    assert (plain["spec"]["completions"], plain["spec"]["parallelism"]) == (1, 1)
    assert plain["spec"]["manualSelector"] is False and plain["spec"]["suspend"] is False
    condition = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    indexed = {
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "backoffLimitPerIndex": 1,
            "podFailurePolicy": {"rules": [condition]},
            "template": {"spec": {"containers": []}},
        }
    }
    defaults.default_job(indexed)
    assert indexed["spec"]["backoffLimit"] == 2_147_483_647
    assert indexed["spec"]["podReplacementPolicy"] == "Failed"
    assert condition["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]


def test_a_cronjobs_job_is_left_to_the_policy_of_its_template():
    # upstream: getJobFromTemplate2 (pkg/controller/cronjob/utils.go) copies the
    # jobTemplate's annotations and spec into the Job and sets a controller reference to
    # the CronJob; the policy was applied to that template, and defaults do not apply
    # again to what a controller made.
    from testkit.kinds import job_from

    _, template = mutate(cronjob({P + "fail-non-retriable": "true"}), DEFAULTS)
    made = job_from(template)
    verdict, out = mutate(made, DEFAULTS)
    assert verdict.allowed and verdict.patch == [] and out == made
    assert rules_of(made) == [
        fp.ignore_disruptions_rule(),
        fp.non_retriable_rule([143], "FailJob", "eval"),
    ]
