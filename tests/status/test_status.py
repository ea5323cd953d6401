"""``retry-webhook status`` (webhook/status) against the test suite's HTTP Kubernetes API
(testkit/fakeapi/), read by the real ``kubernetes`` client through a kubeconfig, and run
as installed: ``.venv/bin/retry-webhook`` and, through the real ``kubectl`` binary's
plugin discovery, ``kubectl retry-policy``.

The cluster is built the way its controllers build it: each workload admitted by the
webhook's own engine (what the API server stores is what the webhook returned), with the
fields the API server adds (``generateSelector``: the Job's selector and template labels;
uid, resourceVersion, creationTimestamp); pods as the Job controller creates them
(``generateName``, the template's labels and annotations, the controller ownerReference,
the tracking finalizer), admitted by the pod webhook and then failed as the kubelet
reports it (terminated container states with exit codes, ``OOMKilled``, ``finishedAt``;
``DisruptionTarget`` conditions); the Job's status as the Job controller writes it
(``failed``, ``uncountedTerminatedPods``, ``FailureTarget`` then ``Failed`` with the
exact reason and message); Events written by the webhook's own ``EventRecorder``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.builders import P, v1_of
from testkit.clusters import (
    BIN,
    NS,
    POLICY,
    T0,
    admit,
    at_minute,
    client_for,
    controller_pod,
    emit,
    failed,
    job_manifest,
    jobset_cluster,
    owner_of,
    run,
    running_job,
    store_job,
    tree,
)
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.servers import scaled
from testkit.tools import ROOT, tool
from testkit.workloads import pod_template
from webhook.admission import engine
from webhook.kinds.registry import apply_defaults
from webhook.policy.config import Config

# --- a running Job: an OOM kill, a preemption -----------------------------------------------


def test_a_running_job_tells_its_attempts_and_what_the_next_one_gets(cluster):
    api, kubeconfig = cluster
    job, (first, _, _) = running_job(api)
    emit(client_for(api.url), "Job", job, "RetryMemoryIncreased", "trainer: memory 2Gi -> 3Gi")
    emit(client_for(api.url), "Job", job, "RetryMemoryIncreased", "trainer: memory 2Gi -> 3Gi")
    done = run(kubeconfig, "job/train", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    story = json.loads(done.stdout)
    assert story["state"] == "Running"
    (told,) = story["jobs"]
    assert told["countedFailures"] == 1 and told["ignoredFailures"] == 1
    assert told["budgets"][0]["field"] == "spec.backoffLimit"
    assert (told["budgets"][0]["limit"], told["budgets"][0]["used"]) == (3, 1)
    oom, preemption, waiting = told["attempts"]
    assert oom["pod"] == first["metadata"]["name"] and oom["node"] == "node-a"
    assert (oom["cause"], oom["exitCode"], oom["counted"]) == ("oom-killed:trainer", 137, True)
    assert oom["nodeFailed"] is True
    assert preemption["disruption"] == "PreemptionByScheduler"
    assert preemption["counted"] is False
    # upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go): the
    # Ignore rule on DisruptionTarget comes first and wins.
    assert preemption["rule"] == {"index": 0, "action": "Ignore"}
    assert preemption["nodeFailed"] is False  # a preempted pod's node did not fail it
    assert waiting["phase"] == "Pending" and waiting["applied"]["attempt"] == 1
    nxt = told["next"]
    assert (nxt["attempt"], nxt["attempts"], nxt["nonSpot"]) == (2, 4, True)
    raised = {(m["container"], m["kind"]): (m["from"], m["to"]) for m in nxt["memory"]}
    assert raised == {("trainer", "request"): ("2Gi", "3Gi"), ("trainer", "limit"): ("2Gi", "3Gi")}
    assert nxt["avoidedNodes"] == ["node-a"] and nxt["avoidedBy"] == "requirement"
    assert nxt["delay"] is None
    (event,) = story["events"]
    assert (event["reason"], event["count"], event["regarding"]) == (
        "RetryMemoryIncreased",
        2,
        "Job/train",
    )
    # The plan is explain's, with the webhook's rules told as its own.
    (plan,) = story["plan"]["items"]
    origins = [r["origin"] for r in plan["rules"]]
    assert origins == [
        "added by retry-policy for ignore-disruptions",
        "added by retry-policy for fail-non-retriable",
    ]


def test_the_text_reads_as_a_story_in_short_lines(cluster):
    api, kubeconfig = cluster
    _, (first, _, _) = running_job(api)
    done = run(kubeconfig, "job/train", "-n", NS)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert max(len(line) for line in text.splitlines()) <= 80
    # The story an operator came for comes first, in this order; the plan only on ask.
    assert text.startswith("Job ml/train: Running\n")
    headings = ("Budget:", "Attempts:", "Next attempt:", "Events from")
    at = [text.index(heading) for heading in headings]
    assert at == sorted(at)
    assert text.rstrip().splitlines()[-1] == "Retry plan: add --plan to see it."
    assert "When a pod fails" not in text
    assert "backoffLimit 3: 1 counted failure, 2 retries left" in text
    assert f"{first['metadata']['name']}: Failed on node-a" in text
    flat = " ".join(text.split())
    assert "OOM-killed (container trainer, exit code 137); counted (no rule matches)" in flat
    assert "disrupted (PreemptionByScheduler; trainer exited 143); not counted: rule 1" in flat
    assert "attempt 2 of 4, on non-spot nodes only" in text
    assert "memory request of trainer: 2Gi -> 3Gi" in text
    assert "keeps off node-a (required)" in text
    # With --plan, ``explain``'s plan as it stands (its renderer's output) ends the story.
    planned = run(kubeconfig, "job/train", "-n", NS, "--plan").stdout
    assert planned.startswith(text[: text.index("Retry plan:")])
    tail = planned[planned.index("Retry plan,") :]
    assert "When a pod fails, Kubernetes checks these rules in order" in tail


# --- a Job our FailJob rule failed ----------------------------------------------------------


def test_a_job_failed_by_our_failjob_rule_names_the_rule_and_its_annotation(cluster):
    api, kubeconfig = cluster
    job = store_job(api, job_manifest("train", POLICY), {})
    pod = controller_pod(job, 0, at_minute(0))
    pod = failed(pod, "node-a", "trainer", 1, at_minute(3))
    pod["metadata"]["uid"] = str(uuid.uuid4())
    api.put("pods", pod)
    name = pod["metadata"]["name"]
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[1]["action"] == "FailJob"  # the webhook's: Ignore first, then FailJob
    # upstream: matchPodFailurePolicy's message, and the FailureTarget then Failed
    # conditions the Job controller writes (pkg/controller/job/job_controller.go).
    message = (
        f"Container trainer for pod {NS}/{name} failed with exit code 1 matching FailJob "
        "rule at index 1"
    )
    conditions = [
        {
            "type": t,
            "status": "True",
            "reason": "PodFailurePolicy",
            "message": message,
            "lastTransitionTime": at_minute(3),
        }
        for t in ("FailureTarget", "Failed")
    ]
    job["status"] = {"startTime": T0, "failed": 1, "conditions": conditions, "active": 0}
    api.put("jobs", job)
    emit(
        client_for(api.url),
        "Job",
        job,
        "RetryPolicyFailedJob",
        f"exit code 1 in trainer of {name} is not retriable (fail-non-retriable)",
    )
    done = run(kubeconfig, "job/train", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    story = json.loads(done.stdout)
    assert story["state"] == "Failed"
    (told,) = story["jobs"]
    assert told["next"] is None
    decision = told["decision"]
    assert (decision["condition"], decision["reason"]) == ("Failed", "PodFailurePolicy")
    assert decision["rule"] == {
        "index": 1,
        "action": "FailJob",
        "origin": "added by retry-policy for fail-non-retriable",
        "annotation": P + "fail-non-retriable",
    }
    assert (decision["pod"], decision["container"], decision["exitCode"]) == (name, "trainer", 1)
    (attempt,) = told["attempts"]
    assert attempt["rule"] == {"index": 1, "action": "FailJob"} and attempt["counted"] is True
    assert [e["reason"] for e in story["events"]] == ["RetryPolicyFailedJob"]
    text = run(kubeconfig, "job/train", "-n", NS).stdout
    assert "Decided: Job train Failed (PodFailurePolicy)" in text
    assert (
        "by podFailurePolicy rule 2 (FailJob): added by retry-policy for fail-non-retriable "
        f"(annotation {P}fail-non-retriable)"
    ) in " ".join(text.split())


def test_a_rule_the_user_wrote_is_named_theirs(cluster):
    api, kubeconfig = cluster
    manifest = job_manifest("own", {P + "backoff-limit": "2"})
    manifest["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
    }
    job = store_job(api, manifest, {})
    pod = failed(controller_pod(job, 0, at_minute(0)), "node-a", "trainer", 42, at_minute(2))
    pod["metadata"]["uid"] = str(uuid.uuid4())
    api.put("pods", pod)
    message = (
        f"Container trainer for pod {NS}/{pod['metadata']['name']} failed with exit code 42 "
        "matching FailJob rule at index 0"
    )
    job["status"] = {
        "failed": 1,
        "conditions": [
            {"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": message}
        ],
    }
    api.put("jobs", job)
    story = json.loads(run(kubeconfig, "job/own", "-n", NS, "-o", "json").stdout)
    rule = story["jobs"][0]["decision"]["rule"]
    assert (rule["origin"], rule["annotation"]) == ("your rule", None)


# --- a JobSet that restarted once -----------------------------------------------------------


def test_a_jobset_counts_its_restarts_and_its_current_run(cluster):
    api, kubeconfig = cluster
    status = {"restarts": 1, "restartsCountTowardsMax": 1}
    jobset, jobs = jobset_cluster(api, status, {"active": 1, "startTime": at_minute(20)})
    name = jobset["metadata"]["name"]
    done = run(kubeconfig, f"jobset/{name}", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    story = json.loads(done.stdout)
    assert story["state"] == "Running"
    (budget,) = story["budgets"]
    assert (budget["field"], budget["limit"], budget["used"]) == (
        "spec.failurePolicy.maxRestarts",
        3,
        1,
    )
    assert sorted(j["name"] for j in story["jobs"]) == sorted(j["metadata"]["name"] for j in jobs)
    roles = {j["role"] for j in story["jobs"]}
    assert all("run 1" in role for role in roles)
    # A pod made now belongs to run 1: the second of the set's 4 runs (restart-attempt).
    nexts = [j["next"] for j in story["jobs"] if j["next"]]
    assert nexts and all((n["attempt"], n["attempts"]) == (2, 4) for n in nexts)
    assert all(n["unit"] == "JobSet run" for n in nexts)
    # The JobSet's own rule and the pods' rules, told as the webhook's.
    first = story["plan"]["items"][0]
    assert any(
        r["origin"].startswith("added by retry-policy for fail-non-retriable")
        for r in first["rules"]
    )


def test_a_jobset_our_rule_failed_names_the_rule_in_its_job(cluster):
    api, kubeconfig = cluster
    # upstream: the JobSet fails at once on rule retryPolicyFailNonRetriable (FailJobSet
    # on PodFailurePolicy): failJobSetActionApplier, its reason and message
    # (FailJobSetActionReason, messageWithFirstFailedJob; jobset pkg/controllers).
    status = {
        "restarts": 0,
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "FailJobSetFailurePolicyAction",
                "message": "applying FailJobSet failure policy action (first failed job: "
                "llm-pretrain-workers-0)",
            }
        ],
    }
    _, jobs = jobset_cluster(api, status, {})
    workers = next(j for j in jobs if "workers" in j["metadata"]["name"])
    pod = controller_pod(workers, 0, at_minute(0))
    pod["metadata"]["uid"] = str(uuid.uuid4())
    api.put("pods", failed(pod, "node-b", "trainer", 2, at_minute(4)))
    message = (
        f"Container trainer for pod {NS}/{pod['metadata']['name']} failed with exit code 2 "
        "matching FailJob rule at index 2"
    )
    workers["status"] = {
        "failed": 1,
        "conditions": [
            {"type": t, "status": "True", "reason": "PodFailurePolicy", "message": message}
            for t in ("FailureTarget", "Failed")
        ],
    }
    api.put("jobs", workers)
    done = run(kubeconfig, "jobset/llm-pretrain", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    story = json.loads(done.stdout)
    assert story["state"] == "Failed"
    assert (story["decision"]["condition"], story["decision"]["reason"]) == (
        "Failed",
        "FailJobSetFailurePolicyAction",
    )
    assert (
        "its first failed Job, llm-pretrain-workers-0, failed with reason PodFailurePolicy: "
        "podFailurePolicy rule 3 (FailJob), added by retry-policy for fail-non-retriable "
        f"(annotation {P}fail-non-retriable)"
    ) in story["notes"]
    told = next(j for j in story["jobs"] if j["name"] == workers["metadata"]["name"])
    assert told["decision"]["rule"]["origin"] == "added by retry-policy for fail-non-retriable"
    assert told["next"] is None


# --- a CronJob --------------------------------------------------------------------------------


def test_a_cronjob_tells_its_latest_jobs(cluster):
    api, kubeconfig = cluster
    manifest = yaml.safe_load((ROOT / "examples" / "cronjob.yaml").read_text())
    cron = admit(manifest)
    cron["status"] = {"lastScheduleTime": at_minute(0)}
    api.store("cronjobs", cron)
    owner = owner_of(cron)
    made = []
    for n in range(5):  # the CronJob controller's Jobs (getJobFromTemplate2): <name>-<minutes>
        template = cron["spec"]["jobTemplate"]
        child = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"nightly-eval-2946{n}",
                "namespace": NS,
                "labels": dict(mapping(template.get("metadata")).get("labels") or {}),
                "annotations": dict(mapping(template.get("metadata")).get("annotations") or {}),
                "ownerReferences": [owner],
            },
            "spec": copy.deepcopy(template["spec"]),
        }
        job = store_job(api, child, {"active": 1} if n == 4 else completed(at_minute(n)))
        job["metadata"]["creationTimestamp"] = f"2026-11-2{n}T03:00:00Z"
        api.put("jobs", job)
        made.append(job)
    store_job(api, job_manifest("unrelated", {}), {})  # in the namespace, not the CronJob's
    done = run(kubeconfig, "cronjob/nightly-eval", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    story = json.loads(done.stdout)
    names = [j["name"] for j in story["jobs"]]
    assert names == ["nightly-eval-29464", "nightly-eval-29463", "nightly-eval-29462"]
    assert story["olderJobs"] == ["nightly-eval-29461", "nightly-eval-29460"]
    assert story["jobs"][0]["budgets"][0]["limit"] == 2
    assert [j["state"] for j in story["jobs"]] == ["Running", "Succeeded", "Succeeded"]
    assert story["jobs"][1]["decision"]["reason"] == "CompletionsReached"
    assert story["plan"]["items"][0]["rules"][0]["origin"].startswith("added by retry-policy")


def completed(at: str) -> dict[str, Any]:
    """The status the Job controller writes when a Job's pods all succeeded (Kubernetes
    1.31+: SuccessCriteriaMet, then Complete, reason CompletionsReached)."""
    conditions = [
        {
            "type": kind,
            "status": "True",
            "reason": "CompletionsReached",
            "message": "Reached expected number of succeeded pods",
            "lastTransitionTime": at,
        }
        for kind in ("SuccessCriteriaMet", "Complete")
    ]
    return {"succeeded": 1, "startTime": T0, "completionTime": at, "conditions": conditions}


def mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


# --- what cannot be read -------------------------------------------------------------------


def test_a_missing_workload_is_exit_2_and_says_so(cluster):
    _, kubeconfig = cluster
    done = run(kubeconfig, "job/nope", "-n", NS)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Job ml/nope not found" in done.stderr and "Traceback" not in done.stderr


def test_a_forbidden_workload_is_exit_2_and_names_the_permission(cluster):
    api, kubeconfig = cluster
    running_job(api)
    api.forbidden.add(("jobs", "train"))
    done = run(kubeconfig, "job/train", "-n", NS)
    assert done.returncode == 2
    assert "HTTP 403" in done.stderr and "get jobs in namespace ml" in done.stderr
    assert "Traceback" not in done.stderr


def test_forbidden_pods_and_nodes_still_tell_the_rest_with_exit_1(cluster):
    api, kubeconfig = cluster
    running_job(api)
    api.forbidden |= {("pods", ""), ("events", "")}
    done = run(kubeconfig, "job/train", "-n", NS, "-o", "json")
    assert done.returncode == 1, done.stderr
    story = json.loads(done.stdout)
    assert story["jobs"][0]["budgets"][0]["used"] == 1  # from the Job's status
    assert story["jobs"][0]["attempts"] == [] and story["jobs"][0]["next"] is None
    assert any("pods in namespace ml" in u and "403" in u for u in story["unread"])
    assert any("Events in namespace ml" in u for u in story["unread"])
    assert "Warning: could not read" in done.stderr


def test_nodes_a_user_may_not_list_leave_avoidance_a_preference(cluster):
    api, kubeconfig = cluster
    running_job(api)
    api.forbidden.add(("nodes", ""))
    story = json.loads(run(kubeconfig, "job/train", "-n", NS, "-o", "json").stdout)
    nxt = story["jobs"][0]["next"]
    assert nxt["avoidedNodes"] == ["node-a"] and nxt["avoidedBy"] == "preference"


def test_no_cluster_is_exit_2(tmp_path):
    done = run(tmp_path / "missing", "job/train", env={"HOME": str(tmp_path)})
    assert done.returncode == 2
    assert "no Kubernetes API" in done.stderr and "Traceback" not in done.stderr
    assert f"kubeconfig {tmp_path / 'missing'} ($KUBECONFIG) does not exist" in done.stderr


@pytest.mark.parametrize("how", ["--kubeconfig", "$KUBECONFIG"])
@pytest.mark.parametrize("content", ["a directory", "not YAML: [", "no current-context"])
def test_an_unusable_kubeconfig_is_named(tmp_path, how, content):
    """Whatever is wrong with it, the error names the file and where it came from."""
    path = tmp_path / "config"
    if content == "a directory":
        path.mkdir()
    else:
        path.write_text("apiVersion: v1\nkind: Config\n" if content.startswith("no") else content)
    flag = ["--kubeconfig", str(path)] if how == "--kubeconfig" else []
    done = subprocess.run(
        [str(BIN / "retry-webhook"), "status", "job/train", *flag],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(path) if not flag else "", "HOME": str(tmp_path)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"Error: no Kubernetes API: cannot use kubeconfig {path} ({how}): ")


def test_a_kubeconfig_that_skips_tls_verification_puts_no_warning_on_screen(tmp_path):
    """``insecure-skip-tls-verify: true`` is the user's choice; kubectl honours it
    silently, and urllib3's InsecureRequestWarning on every request would bury the story."""
    from webhook.tls import certs

    paths = certs.generate(tmp_path / "certs", "api", "default")
    api = FakeAPI().use_tls(paths.cert, paths.key).start()
    try:
        running_job(api)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: '{api.url}', "
            "insecure-skip-tls-verify: true}}]\n"
            "users: [{name: fake, user: {token: test}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
        )
        done = run(kubeconfig, "job/train", "-n", NS)
    finally:
        api.stop()
    assert api.url.startswith("https://")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_an_api_server_that_does_not_answer_is_exit_2(tmp_path):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    done = run(kubeconfig, "job/train", "-n", NS)
    assert done.returncode == 2
    assert "did not answer (connection refused at http://127.0.0.1:9)" in done.stderr
    assert "Traceback" not in done.stderr and "HTTPConnection" not in done.stderr


@pytest.mark.parametrize("ref", ["train", "pod/train", "job/", "job/Bad_Name"])
def test_a_bad_reference_is_exit_2(cluster, ref):
    _, kubeconfig = cluster
    done = run(kubeconfig, ref)
    assert done.returncode == 2 and "Error:" in done.stderr


def test_the_namespace_comes_from_the_kubeconfig_context(cluster, tmp_path):
    api, _ = cluster
    running_job(api)
    config = tmp_path / "ctx"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{api.url}'}}}}]\n"
        "users: [{name: fake, user: {token: test}}]\n"
        f"contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: {NS}}}}}]\n"
    )
    done = run(config, "job/train", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["workload"]["namespace"] == NS


# --- the kubectl plugin -----------------------------------------------------------------------


def test_kubectl_finds_and_runs_the_plugin(cluster):
    api, kubeconfig = cluster
    running_job(api)
    kubectl = tool("kubectl")
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PATH": f"{BIN}{os.pathsep}{Path(kubectl).parent}{os.pathsep}/usr/bin:/bin",
    }
    listed = subprocess.run(
        [kubectl, "plugin", "list"], capture_output=True, text=True, env=env, check=False
    )
    assert "kubectl-retry_policy" in listed.stdout, listed.stderr
    done = subprocess.run(
        [kubectl, "retry-policy", "status", "job/train", "-n", NS, "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(60),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"][0]["countedFailures"] == 1
    usage = subprocess.run(
        [kubectl, "retry-policy", "--help"], capture_output=True, text=True, env=env, check=False
    )
    assert "usage: kubectl retry-policy" in usage.stdout
    # The plugin is the user's: their workloads' commands, not the server's.
    offered = usage.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert offered == ["status", "explain", "dry-run", "test"]
    for command in ("serve", "certs", "release-gates", "check-config"):
        refused = subprocess.run(
            [kubectl, "retry-policy", command, "--help"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert refused.returncode == 2 and "invalid choice" in refused.stderr, command


# --- retry delays, Events in time order, the JSON shape, TrainJobs, per-index budgets -------


def test_a_pod_held_by_a_retry_delay_shows_when_it_may_start(cluster):
    api, kubeconfig = cluster
    _, (_, _, waiting) = running_job(api)
    waiting["spec"]["schedulingGates"] = [{"name": P + "retry-delay"}]
    waiting["metadata"]["annotations"][P + "not-before"] = "2099-01-01T00:00:00Z"
    waiting["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
    ]
    api.put("pods", waiting)
    story = json.loads(run(kubeconfig, "job/train", "-n", NS, "-o", "json").stdout)
    delay = story["jobs"][0]["next"]["delay"]
    assert delay["pod"] == waiting["metadata"]["name"]
    assert delay["notBefore"] == "2099-01-01T00:00:00Z" and delay["secondsLeft"] > 10**8
    text = " ".join(run(kubeconfig, "job/train", "-n", NS).stdout.split())
    assert f"pod {waiting['metadata']['name']} is held until 2099-01-01T00:00:00Z" in text


def test_events_come_oldest_first_with_their_series_counts(cluster):
    api, kubeconfig = cluster
    job, _ = running_job(api)
    other = store_job(api, job_manifest("other", POLICY), {})
    api_client = client_for(api.url)
    emit(api_client, "Job", job, "RetryOnNonSpot", "attempt 2 of 4 on non-spot nodes", at=2e9)
    emit(api_client, "Job", job, "RetryNodesAvoided", "keeping off node-a", at=1e9)
    emit(api_client, "Job", job, "RetryNodesAvoided", "keeping off node-a", at=1.5e9)
    emit(api_client, "Job", other, "RetryOnNonSpot", "another Job's", at=1e9)
    story = json.loads(run(kubeconfig, "job/train", "-n", NS, "-o", "json").stdout)
    told = [(e["reason"], e["count"]) for e in story["events"]]
    assert told == [("RetryNodesAvoided", 2), ("RetryOnNonSpot", 1)]


def test_the_json_keys_are_the_documented_ones(cluster):
    api, kubeconfig = cluster
    running_job(api)
    story = json.loads(run(kubeconfig, "job/train", "-n", NS, "-o", "json").stdout)
    assert story["schema"] == "retry-policy.dev/status/v1"
    assert set(story) == {
        "schema", "workload", "state", "plan", "budgets", "decision", "jobs",
        "olderJobs", "events", "notes", "unread", "audit",
    }  # fmt: skip
    assert set(story["plan"]) == {"source", "items"}
    (job,) = story["jobs"]
    assert set(job) == {
        "name", "uid", "role", "state", "countedFailures", "ignoredFailures", "budgets",
        "attempts", "next", "decision", "notes",
    }  # fmt: skip
    assert set(job["attempts"][0]) == {
        "pod", "phase", "node", "created", "index", "run", "finished", "cause", "container",
        "exitCode", "disruption", "counted", "rule", "nodeFailed", "applied", "deletedBy",
        "disruptionBudget", "peerDisrupted", "inPlace", "category",
    }  # fmt: skip
    assert set(job["next"]) == {
        "unit", "attempt", "attempts", "nonSpot", "memory", "avoidedNodes", "avoidedBy",
        "delay", "changes",
    }  # fmt: skip
    assert set(job["budgets"][0]) == {"object", "field", "limit", "used", "text"}
    documented = (ROOT / "docs" / "STATUS.md").read_text()
    for key in (*story, *job, *job["attempts"][0], *job["next"]):
        assert f"`{key}`" in documented, key


def test_a_trainjob_is_told_by_the_jobset_the_trainer_made(cluster):
    api, kubeconfig = cluster
    docs = list(yaml.safe_load_all((ROOT / "examples" / "trainjob.yaml").read_text()))
    runtime, manifest = docs[0], docs[1]
    from webhook.kinds.trainjob.runtimes import GivenRuntimes

    obj = copy.deepcopy(manifest)
    apply_defaults(obj)
    verdict, trainjob = engine.review_object(
        obj, Config(), NS, runtimes=GivenRuntimes([runtime], NS)
    )
    assert verdict.allowed, verdict.message
    trainjob["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=T0)
    api.store("trainjobs", trainjob)
    # The trainer's JobSet: the runtime's template, named as the TrainJob and controlled
    # by it, with the metadata of the TrainJob's runtime patches (Trainer v2.2+).
    (patch,) = trainjob["spec"]["runtimePatches"]
    template = runtime["spec"]["template"]
    jobset_manifest = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": trainjob["metadata"]["name"],
            "namespace": NS,
            "annotations": patch["trainingRuntimeSpec"]["template"]["metadata"]["annotations"],
            "ownerReferences": [owner_of(trainjob)],
        },
        "spec": copy.deepcopy(template["spec"]),
    }
    jobset = admit(jobset_manifest)
    jobset["status"] = {"restarts": 2, "restartsCountTowardsMax": 2}
    api.store("jobsets", jobset)
    done = run(kubeconfig, "trainjob/llm-finetune", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    story = json.loads(done.stdout)
    assert story["workload"]["kind"] == "TrainJob"
    assert story["plan"]["items"][0]["kind"] == "JobSet"
    (budget,) = story["budgets"]
    assert (budget["limit"], budget["used"]) == (3, 2)


def test_a_rayjob_is_told_by_its_attempts_and_its_submitter_job(cluster):
    """KubeRay retries a failed RayJob whole, on a new RayCluster, while ``status.failed <
    backoffLimit + 1`` (upstream: checkBackoffLimitAndUpdateStatusIfNeeded in
    ray-operator/controllers/ray/rayjob_controller.go), and in K8sJobMode submits each
    attempt by a Job of the RayJob's name it controls (createNewK8sJob, same file)."""
    api, kubeconfig = cluster
    manifest = yaml.safe_load((ROOT / "examples" / "rayjob.yaml").read_text())
    rayjob = admit(manifest)
    assert rayjob["spec"]["backoffLimit"] == 2  # (the webhook wrote the annotation's budget)
    rayjob["status"] = {
        "jobDeploymentStatus": "Running",
        "jobStatus": "RUNNING",
        "failed": 1,
        "succeeded": 0,
    }
    api.store("rayjobs", rayjob)
    name = rayjob["metadata"]["name"]
    submitter = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {
                "ray.io/originated-from-cr-name": name,
                "ray.io/originated-from-crd": "RayJob",
            },
            "ownerReferences": [owner_of(rayjob)],
        },
        "spec": {"backoffLimit": 2, "template": pod_template("ray-job-submitter")},
    }
    job = store_job(api, submitter, {"active": 1, "startTime": at_minute(5)})
    done = run(kubeconfig, f"rayjob/{name}", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    story = json.loads(done.stdout)
    assert (story["workload"]["kind"], story["state"]) == ("RayJob", "Running")
    (budget,) = story["budgets"]
    assert (budget["field"], budget["limit"], budget["used"]) == ("spec.backoffLimit", 2, 1)
    assert [j["name"] for j in story["jobs"]] == [job["metadata"]["name"]]
    assert story["plan"]["items"][0]["kind"] == "RayJob"
    # Once KubeRay gives up, its reason is the story's end.
    rayjob["status"].update(
        jobDeploymentStatus="Failed", jobStatus="FAILED", failed=3, reason="AppFailed"
    )
    api.store("rayjobs", rayjob)
    done = run(kubeconfig, f"rayjobs.ray.io/{name}", "-n", NS, "-o", "json")
    story = json.loads(done.stdout)
    assert story["state"] == "Failed"
    assert (story["decision"]["condition"], story["decision"]["reason"]) == ("Failed", "AppFailed")


def test_an_indexed_job_counts_each_index_against_its_own_budget(cluster):
    api, kubeconfig = cluster
    manifest = job_manifest("shards", {P + "fail-non-retriable": "true"})
    manifest["spec"].update(
        completionMode="Indexed", completions=4, parallelism=4, backoffLimitPerIndex=2,
        maxFailedIndexes=1,
    )  # fmt: skip
    job = store_job(api, manifest, {"active": 4, "failed": 2})
    for index, code in ((1, 137), (1, 143)):
        pod = controller_pod(job, 0, at_minute(index), index)
        pod["metadata"]["uid"] = str(uuid.uuid4())
        api.put("pods", failed(pod, "node-a", "trainer", code, at_minute(index + 1)))
    story = json.loads(run(kubeconfig, "job/shards", "-n", NS, "-o", "json").stdout)
    budgets = {b["field"]: (b["limit"], b["used"]) for b in story["jobs"][0]["budgets"]}
    assert budgets == {"index 1": (2, 2), "spec.maxFailedIndexes": (1, 0)}


# --- the plan without the cluster's defaults file ---------------------------------------------


def test_settings_an_admin_default_gave_are_told_as_cluster_defaults():
    from webhook.policy.config import parse_config
    from webhook.status.story import tell

    defaults = parse_config("defaults: {ignore-disruptions: 'true', backoff-limit: '2'}")
    obj = job_manifest("plain", {})
    obj["metadata"]["namespace"] = NS
    apply_defaults(obj)
    verdict, job = engine.review_object(obj, defaults, NS)
    assert verdict.allowed and P + "applied" in job["metadata"]["annotations"]
    job["metadata"]["uid"] = "uid-plain"
    story = tell(tree(job))
    (plan,) = story.explained
    told = {s.name: (s.value, s.source) for s in plan.settings}
    assert told["ignore-disruptions"] == ("true", "cluster default")
    assert told["backoff-limit"] == ("2", "cluster default")
    assert [r.origin for r in plan.rules] == ["added by retry-policy for ignore-disruptions"]
    # An admin's real file judges it the same way.
    (again,) = tell(tree(job), defaults).explained
    assert [r.origin for r in again.rules] == [r.origin for r in plan.rules]


def test_stored_rules_the_webhook_would_not_write_today_are_read_as_stored():
    from webhook.cli.status import readmit
    from webhook.status.story import tell

    obj = job_manifest("older", POLICY)
    obj["metadata"]["namespace"] = NS
    apply_defaults(obj)
    _, job = engine.review_object(obj, Config(), NS)
    job = v1_of(job)
    job["metadata"]["uid"] = "uid-older"
    # Admitted by an older webhook (its record is version 1: no rules' origins) that wrote
    # its FailJob rule without a container name: admitted today, it would get the rule
    # with the name too (podFailurePolicy is immutable: the stored rules are the ones the
    # Job controller reads). Such a plan is found by admitting it again (``readmit``).
    del job["spec"]["podFailurePolicy"]["rules"][1]["onExitCodes"]["containerName"]
    story = tell(tree(job), readmit=readmit)
    (plan,) = story.explained
    assert any("would change it" in n for n in story.notes)
    assert [r.action for r in plan.rules] == ["Ignore", "FailJob"]
    assert plan.rules[1].when.endswith("in any container")
    assert plan.changes == []


def test_counted_failures_whose_pods_are_gone_are_said_and_listed_again(cluster):
    """The Job counted 2 failures; one failed pod was deleted (a drain deletes what it
    evicts). The next attempt's admission lists the Job's failed pods once, as the
    webhook's history does when it has seen fewer than the Job counted
    (``FailureHistory.fetch``), and says what it could not examine."""
    api, kubeconfig = cluster
    job = store_job(api, job_manifest("train", POLICY), {})
    pod = failed(
        controller_pod(job, 0, at_minute(0)), "node-a", "trainer", 137, at_minute(5), oom=True
    )
    pod["metadata"]["uid"] = str(uuid.uuid4())
    api.put("pods", pod)
    job["status"] = {"active": 0, "failed": 2, "startTime": T0}
    api.put("jobs", job)
    story = json.loads(run(kubeconfig, "job/train", "-n", NS, "-o", "json").stdout)
    (told,) = story["jobs"]
    assert told["countedFailures"] == 2 and len(told["attempts"]) == 1
    nxt = told["next"]
    assert nxt["attempt"] == 3
    assert any("1 earlier failure(s) of this Job not examined" in c for c in nxt["changes"])
    listed = [q for path, q in api.requests if path == f"/api/v1/namespaces/{NS}/pods"]
    assert any("status.phase%3DFailed" in q for q in listed), listed


def test_a_job_restarting_containers_in_place_counts_their_restarts(cluster):
    api, kubeconfig = cluster
    manifest = job_manifest("onfail", {P + "backoff-limit": "4"})
    manifest["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    job = store_job(api, manifest, {"active": 1, "startTime": T0})
    pod = controller_pod(job, 0, at_minute(0))
    pod["metadata"]["uid"] = str(uuid.uuid4())
    pod["spec"]["nodeName"] = "node-a"
    pod["status"] = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "trainer",
                "restartCount": 3,
                "ready": True,
                "state": {"running": {"startedAt": at_minute(9)}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
            }
        ],
    }
    api.put("pods", pod)
    story = json.loads(run(kubeconfig, "job/onfail", "-n", NS, "-o", "json").stdout)
    # upstream: pastBackoffLimitOnFailure (pkg/controller/job/job_controller.go) sums the
    # restarts of running and pending pods against backoffLimit.
    (budget,) = story["jobs"][0]["budgets"]
    assert (budget["limit"], budget["used"]) == (4, 3)


def test_a_running_job_past_its_backoff_limit_has_no_next_attempt(cluster):
    """Counted failures past backoffLimit before the Job controller's sync marks it: no
    attempt comes next, whatever its pods' policy would give one.
    upstream: syncJob (pkg/controller/job/job_controller.go): exceedsBackoffLimit is
    jobCtx.failed > *job.Spec.BackoffLimit."""
    api, kubeconfig = cluster
    job, _ = running_job(api)
    limit = job["spec"]["backoffLimit"]
    job["status"]["failed"] = limit + 1
    api.put("jobs", job)
    done = run(kubeconfig, "job/train", "-n", NS, "-o", "json")
    assert done.returncode == 0, done.stderr
    (told,) = json.loads(done.stdout)["jobs"]
    assert told["countedFailures"] == limit + 1
    assert told["next"] is None
    spent = (
        f"backoffLimit {limit} is used up ({limit + 1} counted failures): the Job controller "
        "fails the Job at its next sync, and makes no pod again"
    )
    assert spent in told["notes"]
    text = run(kubeconfig, "job/train", "-n", NS)
    assert "Next attempt" not in text.stdout and "is used up" in text.stdout
