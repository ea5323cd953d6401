"""In-place retries (``in-place-exit-codes``, ``in-place-scope``) against real parts.

- The real server (``retry-webhook serve`` as deployed, TLS, one worker) whose kubeconfig
  points at the test suite's HTTP Kubernetes API (testkit/fakeapi/), asked for
  ``/version`` by the real ``kubernetes`` client: 1.34, 1.35 (in GKE's form, minor
  ``35+``), 1.36, and an API server that is down.
- Every mutated Job, CronJob, Pod (and JobSet, through its vendored CRD schema) is
  validated against the official Kubernetes 1.35 and 1.36 strict JSON schemas
  (``kubernetes-validate``), and every patch is applied with the real
  ``kubectl patch --local`` (Go's json-patch, the API server's library).
- ``webhook.cluster.version.ServerVersion`` against that API, and the CLI as a real
  process.

What the server does when the API server is down at its start: it starts and becomes
ready all the same (readiness never waits on ``/version``), ``/readyz`` reports the
version as unknown with the error, every object whose policy asks for in-place restarts
is denied with a message telling the admin to pin ``kubernetesVersion`` in the config,
everything else is mutated as usual, and ``/version`` is asked again ``RETRY_SECONDS``
(30 s) later; an API server that goes down after answering leaves the last version in
force.
"""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client
from kubernetes import config as kube_config

from testkit.builders import P, apply, decode_patch, job, pod, review
from testkit.fakeapi import VERSION_DOWN, FakeAPI, version_info, write_kubeconfig
from testkit.kinds import child, cronjob, jobset, replicated
from testkit.servers import BIN, Server, eventually, free_port, metric, scaled, start, stop
from testkit.workloads import kubectl_patch, validate_schema
from webhook import cli
from webhook.cluster.version import REFRESH_SECONDS, RETRY_SECONDS, ServerVersion
from webhook.kube.intent import LAST_APPLIED
from webhook.kube.versions import KubeVersion

CODES = {P + "in-place-exit-codes": "42,75"}
POD_SCOPE = {**CODES, P + "in-place-scope": "pod"}
DEADLINE = {"activeDeadlineSeconds": 3600}
#: The strict schemas every mutated object must pass: the releases that turned the
#: fields on (1.35: container restart rules, 1.36: RestartAllContainers).
SCHEMA_VERSIONS = ("1.35", "1.36")
#: Namespaces whose guard rails bound in-place restarts for the user (1.36 server's config).
RAILS = """\
namespaces:
  bounded:
    guardRails: {inPlaceDeadlineSeconds: 7200}
  unbounded:
    guardRails: {allowUnboundedInPlace: true}
"""
#: What each server's API answers on /version (None: nothing listens, the API is down),
#: and the config it starts with (None: no --config).
CLUSTERS: dict[str, tuple[dict[str, str] | None, str | None]] = {
    "1.34": (version_info("v1.34.3"), ""),
    "1.35": (version_info("v1.35.2-gke.1000", minor="35+"), None),
    "1.36": (version_info("v1.36.0"), RAILS),
    "down": (None, None),
}


def rule(action: str = "Restart") -> dict[str, Any]:
    return {"action": action, "exitCodes": {"operator": "In", "values": [42, 75]}}


@dataclass
class Cluster:
    server: Server
    config: Path | None
    api: FakeAPI | None


def _launch(tmp: Path, name: str) -> Cluster:
    answer, config_text = CLUSTERS[name]
    api = None
    if answer is None:
        url = f"http://127.0.0.1:{free_port()}"  # a port nothing listens on
    else:
        api = FakeAPI().start()
        api.server_version = answer
        url = api.url
    write_kubeconfig(tmp / "kubeconfig", url)
    # The attempt cache of the down cluster never syncs: ready without it after 1 s.
    extra = ["--kube", "kubeconfig", "--cache-sync-timeout", "1"]
    config = None
    if config_text is not None:
        config = tmp / "config.yaml"
        config.write_text(config_text)
        extra += ["--config", str(config)]
    try:
        server = start(
            tmp / "certs",
            *extra,
            metrics_port=free_port(),
            env={"KUBECONFIG": str(tmp / "kubeconfig")},
        )
    except BaseException:
        if api is not None:
            api.stop()
        raise
    return Cluster(server, config, api)


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """One real server per cluster of ``CLUSTERS``, started together (each start takes
    seconds) and kept for the module."""
    with ThreadPoolExecutor(len(CLUSTERS)) as pool:
        futures = {
            name: pool.submit(_launch, tmp_path_factory.mktemp(f"inplace-{name}"), name)
            for name in CLUSTERS
        }
    started = {name: f.result() for name, f in futures.items() if f.exception() is None}
    try:
        for future in futures.values():
            future.result()  # raises the first start that failed
        yield started
    finally:
        for cluster in started.values():
            stop(cluster.server)
            if cluster.api is not None:
                cluster.api.stop()


def admit(server: Server, obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The API server's admission of ``obj``: the mutating webhook, then the validating
    one on the patched object. Returns the mutating response and the patched object
    (``None`` when denied)."""
    response = server.review("/mutate", review(obj))["response"]
    if not response["allowed"]:
        return response, None
    out = apply(obj, decode_patch({"response": response}))
    checked = server.review("/validate", review(out))["response"]
    assert checked["allowed"], checked
    return response, out


def denied(server: Server, obj: dict[str, Any]) -> str:
    """The denial of ``obj`` by the mutating webhook, which the validating one repeats
    (it must: the mutating one may not have run)."""
    response = server.review("/mutate", review(obj))["response"]
    assert not response["allowed"], response
    again = server.review("/validate", review(obj))["response"]
    assert not again["allowed"] and again["status"]["message"] == response["status"]["message"]
    return response["status"]["message"]


def assert_real(
    obj: dict[str, Any], response: dict[str, Any], out: dict[str, Any], tmp: Path
) -> None:
    """Go's json-patch (``kubectl patch --local``) makes of the webhook's patch exactly
    the webhook's patched object, and that object passes the strict 1.35 and 1.36
    schemas."""
    assert kubectl_patch(obj, decode_patch({"response": response}), tmp) == out
    for version in SCHEMA_VERSIONS:
        validate_schema(out, version)


def readyz(server: Server) -> dict[str, Any]:
    status, _, raw = server.request("GET", "/readyz")
    assert status == 200, raw
    return json.loads(raw)


def containers(pod_spec: dict[str, Any]) -> list[tuple[Any, Any]]:
    """Each regular container's (restartPolicy, restartPolicyRules)."""
    return [(c.get("restartPolicy"), c.get("restartPolicyRules")) for c in pod_spec["containers"]]


# --- through the real server ----------------------------------------------------------


@pytest.mark.parametrize("version", ["1.35", "1.36"])
def test_a_job_gets_restart_rules_where_the_api_says_they_are_on(clusters, version, tmp_path):
    """Container restart rules (KEP-5307) are beta and on by default from 1.35: the
    ContainerRestartRules gate in pkg/features/kube_features.go. The 1.35 cluster answers
    in GKE's form (minor ``35+``, gitVersion ``v1.35.2-gke.1000``)."""
    obj = job(CODES, spec=DEADLINE)
    obj["spec"]["template"]["spec"]["containers"].append({"name": "side", "image": "busybox"})
    response, out = admit(clusters[version].server, obj)
    assert out is not None, response
    assert containers(out["spec"]["template"]["spec"]) == [("Never", [rule()])] * 2
    assert out["spec"]["activeDeadlineSeconds"] == 3600
    # kubectl sees the change in one line (dry-run and explain say each).
    assert response["warnings"][0].startswith("retry-policy: 1 change made: ")
    assert_real(obj, response, out, tmp_path)


def test_scope_pod_is_written_at_1_36(clusters, tmp_path):
    """RestartAllContainers (KEP-5532) is on by default from 1.36: the
    RestartAllContainersOnContainerExits gate."""
    obj = job(POD_SCOPE, spec=DEADLINE)
    response, out = admit(clusters["1.36"].server, obj)
    assert out is not None, response
    assert containers(out["spec"]["template"]["spec"]) == [
        ("Never", [rule("RestartAllContainers")])
    ]
    assert_real(obj, response, out, tmp_path)


def test_scope_pod_is_denied_at_1_35_naming_1_36(clusters):
    """At 1.35 the RestartAllContainersOnContainerExits gate is alpha and off: the API
    server refuses the action (AllowRestartAllContainers of the validation options,
    ``GetValidationOptionsFromPodSpecAndMeta`` in pkg/api/pod/util.go); only
    ContainerRestartRules makes it drop fields."""
    message = denied(clusters["1.35"].server, job(POD_SCOPE, spec=DEADLINE))
    assert "annotation retry-policy.dev/in-place-scope" in message
    assert "Kubernetes 1.36 or newer (RestartAllContainersOnContainerExits)" in message
    assert "this cluster is 1.35; use container" in message


def test_an_older_cluster_is_denied_naming_1_35(clusters):
    """At 1.34 the ContainerRestartRules gate is alpha and off: the API server would
    silently drop restartPolicyRules (``dropContainerRestartRules``, from
    ``dropDisabledFields`` in pkg/api/pod/util.go)."""
    message = denied(clusters["1.34"].server, job(CODES, spec=DEADLINE))
    assert "annotation retry-policy.dev/in-place-exit-codes" in message
    assert "need Kubernetes 1.35 or newer (ContainerRestartRules)" in message
    assert "this cluster is 1.34" in message


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36"])
def test_readyz_reports_the_version_and_where_it_came_from(clusters, version):
    """The version the server read from ``/version`` (``major``/``minor`` of version.Info,
    k8s.io/apimachinery/pkg/version/types.go; GKE's ``35+`` read as 35)."""
    assert readyz(clusters[version].server)["kubernetesVersion"] == {
        "source": "apiserver",
        "version": version,
        "error": None,
    }


def test_an_api_down_at_start(clusters):
    """Nothing listens where the kubeconfig points: the server still starts and is
    ready, says why the version is unknown, denies in-place restarts (it cannot tell
    whether the API server would drop them) and mutates everything else."""
    server = clusters["down"].server
    body = readyz(server)
    assert body["status"] == "ready"
    reported = body["kubernetesVersion"]
    assert reported["source"] == "apiserver" and reported["version"] is None
    assert "Connection refused" in reported["error"]
    message = denied(server, job(CODES, spec=DEADLINE))
    assert "the cluster's Kubernetes version is not known" in message
    assert "set kubernetesVersion in the webhook's config" in message
    response, out = admit(server, job({P + "backoff-limit": "2"}))
    assert out is not None and out["spec"]["backoffLimit"] == 2, response


def test_a_config_pin_overrides_an_older_answer(clusters, tmp_path):
    """``kubernetesVersion`` in the config (reloaded live, as a mounted ConfigMap is)
    wins over the API server's 1.34; taken out again, 1.34 rules again."""
    cluster = clusters["1.34"]
    server, config = cluster.server, cluster.config
    assert config is not None
    obj = job(POD_SCOPE, spec=DEADLINE)
    config.write_text('kubernetesVersion: "1.36"\n')
    try:
        eventually(
            lambda: readyz(server)["kubernetesVersion"] == {"source": "config", "version": "1.36"}
        )
        response, out = admit(server, obj)
        assert out is not None, response
        assert containers(out["spec"]["template"]["spec"]) == [
            ("Never", [rule("RestartAllContainers")])
        ]
        assert_real(obj, response, out, tmp_path)
    finally:
        config.write_text("")
    eventually(lambda: readyz(server)["kubernetesVersion"]["source"] == "apiserver")
    assert "this cluster is 1.34" in denied(server, obj)


def _kinds(annotations: dict[str, str]) -> dict[str, tuple[dict[str, Any], Any]]:
    """A bare Pod, a CronJob and a JobSet with in-place restarts and a deadline, and how
    to find their pod spec."""
    return {
        "Pod": (pod(annotations, spec={"activeDeadlineSeconds": 600}), lambda o: o["spec"]),
        "CronJob": (
            cronjob(annotations, job_spec=DEADLINE),
            lambda o: o["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        ),
        # Never written by the user (JobSet's default OnFailure is
        # test_a_jobsets_defaulted_on_failure_becomes_never's).
        "JobSet": (
            jobset(annotations, jobs=[replicated("workers", restart_policy="Never", **DEADLINE)]),
            lambda o: child(o, 0)["template"]["spec"],
        ),
    }


@pytest.mark.parametrize("kind", ["Pod", "CronJob", "JobSet"])
@pytest.mark.parametrize(
    ("version", "annotations", "action"),
    [("1.35", CODES, "Restart"), ("1.36", POD_SCOPE, "RestartAllContainers")],
    ids=["1.35-container", "1.36-pod"],
)
def test_other_kinds_get_restart_rules(clusters, kind, version, annotations, action, tmp_path):
    """The rules go where each kind's pods come from: a bare Pod's spec, a CronJob's
    jobTemplate, each replicated Job of a JobSet."""
    obj, pod_spec = _kinds(annotations)[kind]
    response, out = admit(clusters[version].server, obj)
    assert out is not None, response
    assert containers(pod_spec(out)) == [("Never", [rule(action)])]
    assert_real(obj, response, out, tmp_path)


def test_a_jobsets_defaulted_on_failure_becomes_never(clusters, tmp_path):
    """JobSet's own webhook defaults an unset restartPolicy to OnFailure
    (jobSetWebhook.Default, pkg/webhooks/jobset_webhook.go), and that is what reaches ours
    after it: the user asked for nothing, so it becomes Never, as it does for a
    podFailurePolicy. An OnFailure the user wrote (in the kubectl apply record) is kept,
    and the annotation denied."""
    server = clusters["1.36"].server
    obj = jobset(CODES, jobs=[replicated("workers", **DEADLINE)], applied=True)
    child(obj, 0)["template"]["spec"]["restartPolicy"] = "OnFailure"
    response, out = admit(server, obj)
    assert out is not None, response
    pod_spec = child(out, 0)["template"]["spec"]
    assert pod_spec["restartPolicy"] == "Never"
    assert containers(pod_spec) == [("Never", [rule()])]
    assert response["warnings"][0].startswith("retry-policy: 2 changes made: ")
    assert_real(obj, response, out, tmp_path)
    jobs = [replicated("workers", restart_policy="OnFailure", **DEADLINE)]
    message = denied(server, jobset(CODES, jobs=jobs, applied=True))
    assert "restartPolicy is OnFailure, which already restarts every failed container" in message


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (job(CODES), "spec.activeDeadlineSeconds (or the pod template's)"),
        (pod(CODES), "spec.activeDeadlineSeconds"),
        (cronjob(CODES), "spec.jobTemplate.spec.activeDeadlineSeconds (or the pod template's)"),
    ],
    ids=["Job", "Pod", "CronJob"],
)
def test_unbounded_restarts_are_denied_naming_the_deadline(clusters, obj, field):
    """A restart in place is no pod failure: under restartPolicy Never the Job controller
    counts none of them against backoffLimit (pastBackoffLimitOnFailure counts restarts
    only under OnFailure, pkg/controller/job/job_controller.go), so only a deadline ends
    them."""
    message = denied(clusters["1.36"].server, obj)
    assert "backoffLimit never ends them: set " + field in message


def test_the_admins_default_deadline_is_written(clusters, tmp_path):
    """guardRails.inPlaceDeadlineSeconds of the namespace: written where no deadline is."""
    obj = job(CODES, namespace="bounded")
    response, out = admit(clusters["1.36"].server, obj)
    assert out is not None, response
    assert out["spec"]["activeDeadlineSeconds"] == 7200
    assert containers(out["spec"]["template"]["spec"]) == [("Never", [rule()])]
    assert response["warnings"][0].startswith("retry-policy: 2 changes made: ")
    assert_real(obj, response, out, tmp_path)


def test_unbounded_restarts_the_admin_allowed_are_warned(clusters, tmp_path):
    """guardRails.allowUnboundedInPlace: written without a deadline, with a warning on
    every admission (the API server shows a webhook's warnings to the client:
    ``warnings`` of AdmissionResponse, k8s.io/api/admission/v1)."""
    obj = pod(CODES, namespace="unbounded")
    response, out = admit(clusters["1.36"].server, obj)
    assert out is not None, response
    assert "activeDeadlineSeconds" not in out["spec"]
    assert containers(out["spec"]) == [("Never", [rule()])]
    assert any("guardRails.allowUnboundedInPlace" in w for w in response["warnings"])
    assert_real(obj, response, out, tmp_path)


def test_the_containers_given_rules_are_counted(clusters):
    """retry_webhook_retry_actions_total{action="in_place_rules"} counts containers."""
    server = clusters["1.36"].server

    def count() -> float:
        samples = server.metrics()
        return metric(samples, "retry_webhook_retry_actions_total", action="in_place_rules")

    before = count()
    two = job(CODES, name="two", spec=DEADLINE)
    two["spec"]["template"]["spec"]["containers"].append({"name": "side", "image": "busybox"})
    assert admit(server, two)[1] is not None
    eventually(lambda: count() >= before + 2)


# --- as the kubelet, the scheduler, the Job and JobSet controllers judge them ----------

#: The strict schemas the round-2 behaviours are checked against.
ALL_SCHEMAS = ("1.35", "1.36", "1.37")
IGNORE_MAX = "RestartJobSetAndIgnoreMaxRestarts"
FAIL_NON_RETRIABLE = {**CODES, P + "fail-non-retriable": "true"}


def assert_patched(obj: dict[str, Any], response: dict[str, Any], out: dict[str, Any], tmp: Path):
    """Go's json-patch makes of the patch the server's patched object, which passes the
    strict 1.35, 1.36 and 1.37 schemas."""
    assert kubectl_patch(obj, decode_patch({"response": response}), tmp) == out
    for version in ALL_SCHEMAS:
        validate_schema(out, version)


def uncounted_jobset(rule_: dict[str, Any], *, pod_deadline: bool = False) -> dict[str, Any]:
    spec = replicated("workers", restart_policy="Never", **DEADLINE)
    if pod_deadline:
        spec["template"]["spec"]["template"]["spec"]["activeDeadlineSeconds"] = 600
    return jobset(CODES, jobs=[spec], failure_policy={"maxRestarts": 2, "rules": [rule_]})


@pytest.mark.parametrize(
    "rule_",
    [
        {"name": "again", "action": IGNORE_MAX, "onJobFailureReasons": ["DeadlineExceeded"]},
        {"name": "always", "action": IGNORE_MAX},
    ],
    ids=["DeadlineExceeded", "no-reasons"],
)
def test_a_jobset_deadline_an_uncounted_restart_follows_is_denied(clusters, rule_, tmp_path):
    """A Job past activeDeadlineSeconds fails with DeadlineExceeded; JobSet's first rule
    that applies (``ruleIsApplicable``: no reasons means every reason) restarts the set,
    and one ending in AndIgnoreMaxRestarts never checks maxRestarts
    (``restartJobSetAndIgnoreMaxRestartsActionApplier``, pkg/controllers/failure_policy.go
    of kubernetes-sigs/jobset): the deadline bounds nothing, denied as unbounded by both
    webhooks. The pod template's deadline bounds them while the rule does not also take
    the failure its pods end in (BackoffLimitExceeded)."""
    server = clusters["1.36"].server
    message = denied(server, uncounted_jobset(rule_))
    assert (
        "spec.replicatedJobs[0].template.spec.activeDeadlineSeconds bounds nothing: your "
        f"spec.failurePolicy.rules[0] ({IGNORE_MAX}) restarts the set without counting"
    ) in message
    obj = uncounted_jobset(rule_, pod_deadline=True)
    if "onJobFailureReasons" not in rule_:
        assert "so the pod template's deadline bounds nothing either" in denied(server, obj)
        return
    response, out = admit(server, obj)
    assert out is not None, response
    assert containers(child(out, 0)["template"]["spec"]) == [("Never", [rule()])]
    assert_patched(obj, response, out, tmp_path)


def test_scope_pod_warns_once_that_pods_stay_pending_on_older_kubelets(clusters, tmp_path):
    """RestartAllContainers is a node-declared feature (``InferForScheduling`` of
    k8s.io/component-helpers/nodedeclaredfeatures/features/restartallcontainers): the
    scheduler's NodeDeclaredFeatures plugin places such pods only on nodes declaring
    RestartAllContainersOnContainerExits. Warned once per object, in under 120
    characters, also for a JobSet with two replicated Jobs."""
    server = clusters["1.36"].server
    note = (
        "retry-policy: in-place-scope pod: pods stay Pending unless a node declares "
        "RestartAllContainersOnContainerExits"
    )
    jobs = [replicated(n, restart_policy="Never", **DEADLINE) for n in ("leader", "workers")]
    for obj in (job(POD_SCOPE, spec=DEADLINE), jobset(POD_SCOPE, jobs=jobs)):
        response, out = admit(server, obj)
        assert out is not None, response
        assert response["warnings"].count(note) == 1 and len(note) < 120
        assert_patched(obj, response, out, tmp_path)
    response, _ = admit(server, job(CODES, spec=DEADLINE))
    assert note not in response["warnings"]


def test_your_fail_rules_on_in_place_codes_as_the_job_controller_reads_them(clusters, tmp_path):
    """``matchOnExitCodes`` (pkg/controller/job/pod_failure_policy.go) reads regular
    containers, then init containers; a rule without containerName matches both. Naming
    the regular container and only in-place codes, the rule could never fire: denied.
    Without containerName it still fires for the init container: admitted, warned."""
    server = clusters["1.36"].server
    named = {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In",
                                                   "values": [42]}}  # fmt: skip
    obj = job(CODES, spec={**DEADLINE, "podFailurePolicy": {"rules": [named]}})
    assert "(FailJob) fails only on exit code 42 of container main" in denied(server, obj)
    unnamed = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}
    obj = job(CODES, spec={**DEADLINE, "podFailurePolicy": {"rules": [unnamed]}})
    obj["spec"]["template"]["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    response, out = admit(server, obj)
    assert out is not None, response
    assert (
        "retry-policy: your spec.podFailurePolicy.rules[0] fires on exit code 42 only for init "
        "containers: the regular ones restart in place on it" in response["warnings"]
    )
    assert out["spec"]["podFailurePolicy"]["rules"] == [unnamed]
    assert_patched(obj, response, out, tmp_path)


def test_fail_non_retriable_retries_in_place_codes_only_where_they_restart(clusters, tmp_path):
    """Only regular containers restart in place: their FailJob rules' NotIn lists hold
    42 and 75; the init container's keeps the retriable 143 alone, so its exit 42 fails
    the Job (``matchOnExitCodes`` reads init containers too). A container with its own
    restartPolicy OnFailure keeps it, takes no rule, is admitted with a warning, and
    restarts in place on 42 as well."""
    server = clusters["1.36"].server
    obj = job(FAIL_NON_RETRIABLE, spec=DEADLINE)
    template = obj["spec"]["template"]["spec"]
    template["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    template["containers"].append(
        {"name": "agent", "image": "busybox", "restartPolicy": "OnFailure"}
    )
    response, out = admit(server, obj)
    assert out is not None, response
    rules = out["spec"]["podFailurePolicy"]["rules"]
    assert [r["onExitCodes"] for r in rules[1:]] == [
        {"containerName": "main", "operator": "NotIn", "values": [42, 75, 143]},
        {"containerName": "agent", "operator": "NotIn", "values": [42, 75, 143]},
        {"containerName": "fetch", "operator": "NotIn", "values": [143]},
    ]
    pod_spec = out["spec"]["template"]["spec"]
    assert containers(pod_spec) == [("Never", [rule()]), ("OnFailure", None)]
    assert (
        "retry-policy: spec.template: container agent keeps its restartPolicy OnFailure, which "
        "restarts it in place on any non-zero exit" in response["warnings"]
    )
    assert_patched(obj, response, out, tmp_path)


def test_a_bare_pods_denial_names_spec_restart_policy(clusters):
    server = clusters["1.36"].server
    obj = pod(CODES, spec={"restartPolicy": "Always", "activeDeadlineSeconds": 600})
    assert denied(server, obj) == (
        f"retry-policy: annotation {P}in-place-exit-codes: spec.restartPolicy is 'Always'; "
        "in-place-exit-codes needs Never"
    )


def explain_json(tmp: Path, obj: dict[str, Any], events: str) -> dict[str, Any]:
    source = _write(tmp, [obj])
    result = subprocess.run(
        [str(BIN), "explain", "-f", str(source), "--kubernetes-version", "1.36", "-o", "json",
         "--simulate", events],
        capture_output=True, text=True, timeout=scaled(60), check=False,
    )  # fmt: skip
    assert result.returncode == cli.EXIT_OK, result.stderr
    (item,) = json.loads(result.stdout)["items"]
    return item


def test_explain_cli_success_restarts_and_sidecars(tmp_path):
    """Through the installed CLI: a NotIn rule matches exit code 0 too
    (``findMatchingContainerRestartRule``), so ``--simulate 0`` restarts the container,
    which never completes; a native sidecar's RestartAllContainers rule restarts the pod
    in place and its other exits restart it, never a pod failure; a success no rule
    restarts is refused."""
    own = [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [1]}}]
    pod_rule = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [88]}}]
    obj = _manifest("own", {P + "fail-non-retriable": "true"}, **DEADLINE)
    template = obj["spec"]["template"]["spec"]
    template["containers"][0].update(restartPolicy="Never", restartPolicyRules=own)
    template["initContainers"] = [
        {
            "name": "proxy",
            "image": "envoy",
            "restartPolicy": "Always",
            "restartPolicyRules": pod_rule,
        }
    ]
    item = explain_json(tmp_path, obj, "0,proxy:88,proxy:3,1")
    main, proxy = item["inPlace"]["containers"]
    assert (main["sidecar"], main["groups"][0]["codes"][:2]) == (False, [0, 2])
    assert "exit code 0 is success: the container never completes" in main["groups"][0]["text"]
    assert proxy["sidecar"] and [g["outcome"] for g in proxy["groups"]] == [
        "restart-pod",
        "restart",
    ]
    steps = item["simulation"]["steps"]
    assert [
        (r["container"], r["exitCode"], r["wholePod"]) for s in steps for r in s["inPlace"]
    ] == [
        ("main", 0, False),
        ("proxy", 88, True),
        ("proxy", 3, False),
    ]
    assert steps[-1]["action"] == "FailJob"
    source = _write(tmp_path, [_manifest("plain", CODES, **DEADLINE)])
    refused = subprocess.run(
        [str(BIN), "explain", "-f", str(source), "--kubernetes-version", "1.36", "--simulate", "0"],
        capture_output=True, text=True, timeout=scaled(60), check=False,
    )  # fmt: skip
    assert refused.returncode == cli.EXIT_INPUT
    assert "exit code 0 is success and no restart rule restarts on it" in refused.stderr


def test_dry_run_cli_denies_an_uncounted_jobset_deadline(tmp_path):
    """The CLI judges as the server does: exit 1, the JobSet rule named."""
    manifest = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "pretrain", "annotations": dict(CODES)},
        "spec": {
            "failurePolicy": {"maxRestarts": 2, "rules": [{"name": "again", "action": IGNORE_MAX}]},
            "replicatedJobs": [
                {"name": "workers", "replicas": 1, "template": _manifest("w", {}, **DEADLINE)}
            ],
        },
    }
    del manifest["spec"]["replicatedJobs"][0]["template"]["metadata"]
    result = dry_run("-f", str(_write(tmp_path, [manifest])), "--kubernetes-version", "1.36")
    assert result.returncode == cli.EXIT_DENIED, result.stderr
    assert "Error: JobSet/pretrain denied:" in result.stderr
    assert f"your spec.failurePolicy.rules[0] ({IGNORE_MAX}) restarts the set" in result.stderr


# --- the strict schemas ---------------------------------------------------------------


def _schema(version: str, name: str) -> dict[str, Any]:
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    return json.loads((root / f"v{version}.0-local-strict" / name).read_text())


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_the_strict_schemas_know_restart_rules_but_not_the_gates(version):
    """The 1.35 and 1.36 schemas define a container's restartPolicyRules (so a misspelled
    rule fails them), with ``action`` a free string: the published OpenAPI holds every
    field whatever its gate (1.34's too, where the gate is off) and leaves the allowed
    actions to the API server's validation (pkg/apis/core/validation/validation.go).
    The schemas cannot tell a cluster that drops the fields; the version check must."""
    container = _schema(version, "container-v1.json")["properties"]
    assert "restartPolicyRules" in container and "restartPolicy" in container
    defs = _schema(version, "_definitions.json")["$defs"]
    action = defs["io.k8s.api.core.v1.ContainerRestartRule"]["properties"]["action"]
    assert action["type"] == "string" and "enum" not in action
    assert "restartPolicyRules" in _schema("1.34", "container-v1.json")["properties"]
    obj = job(CODES, spec=DEADLINE)
    spec = obj["spec"]["template"]["spec"]["containers"][0]
    spec["restartPolicy"] = "Never"
    spec["restartPolicyRules"] = [rule("RestartAllContainers")]
    validate_schema(obj, version)
    spec["restartPolicyRules"] = [{"action": "Restart", "exitCode": {"operator": "In"}}]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_schema(obj, version)


# --- ServerVersion with the real kubernetes client ------------------------------------


@pytest.fixture(scope="module")
def version_api():
    api = FakeAPI().start()
    yield api
    api.stop()


@pytest.fixture
def api(version_api):
    """The module's API, answering 1.36 again after each test."""
    yield version_api
    version_api.server_version = version_info("v1.36.0")
    version_api.version_status = 200


def server_version(url: str, tmp: Path) -> ServerVersion:
    """A ServerVersion on the real client, configured from a kubeconfig as the server's is."""
    configuration = client.Configuration()
    kube_config.load_kube_config(
        str(write_kubeconfig(tmp / "kubeconfig", url)), client_configuration=configuration
    )
    return ServerVersion(client.ApiClient(configuration), timeout=2.0)


def asked(api: FakeAPI) -> int:
    """How many times /version was asked (the Python client asks ``/version/``)."""
    return sum(1 for path, _ in api.requests if path.rstrip("/") == "/version")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (version_info("v1.36.0"), KubeVersion(1, 36)),
        (version_info("v1.35.2-gke.1000", minor="35+"), KubeVersion(1, 35)),
        (version_info("v1.35.4-eks-4a3d2f1", minor="35+"), KubeVersion(1, 35)),
        (version_info("v1.34.3"), KubeVersion(1, 34)),
    ],
    ids=["1.36", "gke-35+", "eks-35+", "1.34"],
)
def test_the_version_is_read_from_the_api(api, tmp_path, answer, expected):
    """``major``/``minor`` of version.Info (k8s.io/apimachinery/pkg/version/types.go), as
    strings; GKE and EKS write the minor as ``35+``. The Python client's
    ``VersionApi.get_code`` asks ``/version/``."""
    api.server_version = answer
    versions = server_version(api.url, tmp_path)
    versions.poll(now=0.0)
    assert versions.kubernetes_version() == expected
    assert versions.last_error is None and versions.checked_at == 0.0
    assert versions.stats() == {"source": "apiserver", "version": str(expected), "error": None}


def test_an_emulated_version_is_the_one_whose_gates_are_on(api, tmp_path):
    """A 1.36 API server run with ``--emulated-version=1.35`` (KEP-4330) reports its binary
    as ``major``/``minor`` and 1.35 as ``emulationMajor``/``emulationMinor``
    (k8s.io/apimachinery/pkg/version/types.go); its feature gates default as 1.35's do,
    so RestartAllContainers is off there: the emulated version is the cluster's."""
    api.server_version = version_info("v1.36.0", emulated="1.35")
    versions = server_version(api.url, tmp_path)
    versions.poll(now=0.0)
    assert versions.kubernetes_version() == KubeVersion(1, 35)


@pytest.mark.parametrize("down", ["500", "closed", "refused"])
def test_an_api_down_at_the_first_poll_leaves_the_version_unknown(api, tmp_path, down):
    """An error answer (the client's ApiException), a connection closed without one and
    nothing listening (urllib3's MaxRetryError, after its default retries)."""
    url = api.url
    if down == "500":
        api.version_status = 500
    elif down == "closed":
        api.version_status = VERSION_DOWN
    else:
        url = f"http://127.0.0.1:{free_port()}"
    versions = server_version(url, tmp_path)
    versions.poll(now=0.0)
    assert versions.kubernetes_version() is None
    assert versions.last_error
    assert versions.stats()["version"] is None and versions.stats()["error"] == versions.last_error


def test_an_api_down_after_an_answer_keeps_the_last_version(api, tmp_path):
    """A control plane that fails for a while (an upgrade, a blip) has not gone back in
    version: the last answer stays in force, the error is reported until an answer
    comes again."""
    versions = server_version(api.url, tmp_path)
    versions.poll(now=0.0)
    api.version_status = 500
    versions.poll(now=REFRESH_SECONDS)
    assert versions.kubernetes_version() == KubeVersion(1, 36)
    assert "500" in (versions.last_error or "")
    assert versions.checked_at == 0.0  # the answer kept is the first one
    api.version_status = 200
    versions.poll(now=REFRESH_SECONDS + RETRY_SECONDS)
    assert versions.last_error is None and versions.checked_at == REFRESH_SECONDS + RETRY_SECONDS


def test_the_version_is_refreshed_every_refresh_interval(api, tmp_path):
    """An upgraded control plane is seen within REFRESH_SECONDS, and /version is not asked
    more often than that."""
    versions = server_version(api.url, tmp_path)
    start_count = asked(api)
    versions.poll(now=100.0)
    api.server_version = version_info("v1.37.0")
    versions.poll(now=100.0 + REFRESH_SECONDS - 1)
    assert asked(api) == start_count + 1
    assert versions.kubernetes_version() == KubeVersion(1, 36)
    versions.poll(now=100.0 + REFRESH_SECONDS)
    assert asked(api) == start_count + 2
    assert versions.kubernetes_version() == KubeVersion(1, 37)


def test_a_failure_is_retried_sooner_than_a_refresh(api, tmp_path):
    """After a failure /version is asked again RETRY_SECONDS later, not REFRESH_SECONDS:
    a server that started while its API was down learns the version within 30 s."""
    versions = server_version(api.url, tmp_path)
    api.version_status = 500
    versions.poll(now=0.0)
    api.version_status = 200
    failed = asked(api)
    versions.poll(now=RETRY_SECONDS - 1)
    assert asked(api) == failed and versions.kubernetes_version() is None
    versions.poll(now=RETRY_SECONDS)
    assert versions.kubernetes_version() == KubeVersion(1, 36)


# --- the CLI as a real process --------------------------------------------------------


def _write(tmp: Path, objects: list[dict[str, Any]]) -> Path:
    path = tmp / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return path


def _manifest(name: str, annotations: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": dict(annotations)},
        "spec": {
            **spec,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox:1.36"}],
                }
            },
        },
    }


def dry_run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN), "dry-run", *argv],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )


def test_dry_run_into_a_pipe_closed_early_stops_quietly(tmp_path):
    """``retry-webhook dry-run -f <file> | head -1``: head exits after one line, the
    next write fails with EPIPE; the command stops with 141 (128 + SIGPIPE, what a shell
    reports for a command a closed pipe stopped) and no traceback."""
    jobs = [_manifest(f"job-{n}", CODES, **DEADLINE) for n in range(300)]
    source = _write(tmp_path, jobs)
    stderr = tmp_path / "stderr"
    result = subprocess.run(
        [
            "bash",
            "-c",
            f'"{BIN}" dry-run -f "{source}" --kubernetes-version 1.35 2>"{stderr}" | head -1; '
            'exit "${PIPESTATUS[0]}"',
        ],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert result.stdout == "apiVersion: batch/v1\n"
    assert result.returncode == cli.EXIT_PIPE, stderr.read_text()
    errors = stderr.read_text()
    assert "Traceback" not in errors and "BrokenPipeError" not in errors
    assert "restarts in place on exit 42,75" in errors  # it did run before the pipe closed


def test_dry_run_for_an_older_cluster_denies_naming_1_35(tmp_path):
    """``--kubernetes-version`` is the cluster the dry run judges for: at 1.34 the
    ContainerRestartRules gate is off and the API server would drop the rules
    (``dropDisabledFields``, pkg/api/pod/util.go), so the Job is denied (exit 1)."""
    result = dry_run(
        "-f",
        str(_write(tmp_path, [_manifest("old", CODES, **DEADLINE)])),
        "--kubernetes-version",
        "1.34",
    )
    assert result.returncode == cli.EXIT_DENIED
    assert "Error: Job/old denied:" in result.stderr
    assert "need Kubernetes 1.35 or newer (ContainerRestartRules); this cluster is 1.34" in (
        result.stderr
    )
    assert yaml.safe_load(result.stdout) is None  # nothing admitted, nothing printed


def test_a_bad_kubernetes_version_is_a_usage_error(tmp_path):
    """A version that does not parse is argparse's usage error (exit 2, the usage line and
    the reason on stderr), before any object is read."""
    source = _write(tmp_path, [_manifest("any", CODES, **DEADLINE)])
    result = dry_run("-f", str(source), "--kubernetes-version", "abc")
    assert result.returncode == 2
    assert "argument --kubernetes-version: 'abc': accepted: a Kubernetes version such as 1.35" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_dry_run_output_passes_kubectl_and_the_schemas(tmp_path, version):
    """Each object's patch (``-o patch``), applied by Go's json-patch to the object as the
    dry run hands it to the webhook (``cli.prepare``), is the object ``-o json`` prints,
    which passes the strict schemas; scope pod is denied at 1.35 and written at 1.36."""
    cron = copy.deepcopy(cronjob(CODES, job_spec=DEADLINE))
    cron["metadata"].pop("namespace")
    bare = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare", "annotations": dict(POD_SCOPE)},
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": 600,
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    }
    objects = [
        _manifest("train", CODES, **DEADLINE),
        cron,
        bare,
        _manifest("all", POD_SCOPE, **DEADLINE),
    ]
    source = str(_write(tmp_path, objects))
    versioned = ("-f", source, "-n", "ml", "--kubernetes-version", version)
    patches = dry_run(*versioned, "-o", "patch")
    printed = dry_run(*versioned, "-o", "json")
    admitted = objects if version == "1.36" else objects[:2]
    if version == "1.36":
        assert patches.returncode == printed.returncode == cli.EXIT_OK, patches.stderr
    else:
        assert patches.returncode == printed.returncode == cli.EXIT_DENIED
        for name in ("Pod/bare", "Job/all"):
            assert f"Error: {name} denied: retry-policy: annotation {P}in-place-scope" in (
                patches.stderr
            )
    items = json.loads(printed.stdout)["items"]
    answers = json.loads(patches.stdout)
    assert [(i["kind"], i["metadata"]["name"]) for i in items] == [
        (o["kind"], o["metadata"]["name"]) for o in admitted
    ]
    for obj, answer, item in zip(admitted, answers, items, strict=True):
        prepared, synthetic = cli.prepare(obj, "ml")
        assert synthetic  # the record kubectl apply would write, left out of the output
        patched = kubectl_patch(prepared, answer["patch"], tmp_path)
        del patched["metadata"]["annotations"][LAST_APPLIED]
        assert patched == item
        for schema in SCHEMA_VERSIONS:
            validate_schema(item, schema)
    rules = [c["restartPolicyRules"] for item in items for c in _pod_spec(item)["containers"]]
    expected = [[rule()], [rule()]] + (
        [[rule("RestartAllContainers")]] * 2 if version == "1.36" else []
    )
    assert rules == expected


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"] if obj["kind"] != "Pod" else spec


def test_an_api_that_never_answers_is_asked_twice_per_poll(tmp_path):
    """An API server that accepts connections and never answers: one retry, not urllib3's
    default three, so a worker's start waits two timeouts at most."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)  # held open, never answered

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    configuration = client.Configuration()
    kube_config.load_kube_config(
        str(write_kubeconfig(tmp_path / "kubeconfig", url)), client_configuration=configuration
    )
    source = ServerVersion(client.ApiClient(configuration), timeout=0.2)
    try:
        source.poll(now=0.0)
        assert source.kubernetes_version() is None
        assert source.last_error is not None
        assert len(accepted) == 2
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
