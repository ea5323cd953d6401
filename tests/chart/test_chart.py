"""The Helm chart, rendered by the real ``helm`` and checked field by field.

Every rendered manifest is validated against the Kubernetes 1.37 strict schemas
(``kubernetes_validate``); what matters for an admission webhook in production
(failure policies, namespace selector, rules, matchConditions, hardening, RBAC,
certificates) is asserted one property at a time, and the rendered config.yaml is fed
to the real config loader (``retry-webhook check-config``). No snapshot files: a test
names the property it protects.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from testkit.chart import (
    CHART,
    K8S_VERSION,
    NAMESPACE,
    RELEASE,
    WRITE_VERBS,
    deployment_pod,
    hook_events,
    objects,
    one,
    render,
    render_fails,
    run_helm,
    webhooks,
)
from testkit.servers import scaled
from testkit.tools import ROOT
from webhook.kinds.base import Restores
from webhook.kinds.registry import KINDS

pytestmark = pytest.mark.tools

PREFIX = "retry-policy.dev/"
#: Writes the webhook's identity holds cluster-wide, unscoped by name, each for a reason
#: the controller's docs give: (resources, sorted verbs).
UNSCOPED_WRITES: list[tuple[list[str], list[str]]] = [
    # The controller's record of a workload's failures, on the workload itself
    # (webhook/controller/recorder.py): any Job or JobSet a user annotates, in any namespace.
    (["jobs"], ["patch"]),
    (["jobsets"], ["patch"]),
    # Events about retry decisions (webhook/cluster/events.py; docs/OPERATIONS.md#events):
    # an Event lives in the namespace of the workload it is about, any namespace; its name
    # is derived from what it says, unknown until then, so nothing scopes it by name.
    # update counts a repeat into an existing Event's series.
    (["events"], ["create", "update"]),
    # The gate-releasing hook removes retry-delay gates (docs/OPERATIONS.md, "Retry-delay
    # gates"): of pods in any namespace, whose names no rule can know.
    (["pods"], ["patch"]),
    # Budgets per cause (webhook/controller/disruptions.py, restarts.py) and disruptions by
    # deletion (webhook/cluster/deletions.py): a condition on any pod of a workload that
    # asked, the deadline of a pod that used its restarts in place.
    (["pods"], ["patch"]),
    (["pods/status"], ["patch"]),
    # peer-disruptions on a JobSet (webhook/kinds/jobset/peers.py): FailureTarget on
    # a disrupted pod's child Job, in any namespace; the admission policy lets only that
    # condition through (tests/chart/test_jobset_peers.py).
    (["jobs/status"], ["patch"]),
]
DELETIONS_HOOK = "pod-deletions.validate.retry-policy.dev"
SCHEMA_ERROR = "don't meet the specifications of the schema"


# --- tools and rendering -----------------------------------------------------------


def container(docs: list[dict]) -> dict:
    containers = deployment_pod(docs)["spec"]["containers"]
    assert [c["name"] for c in containers] == ["webhook"]
    return containers[0]


def merged(*layers: dict) -> dict:
    out: dict = {}
    for layer in layers:
        _merge(out, copy.deepcopy(layer))
    return out


def _merge(into: dict, layer: dict) -> None:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


#: The chart's kind switches (``webhook.kinds``), as the registry names them.
ALL_KINDS = tuple(spec.chart_key for spec in KINDS)
WORKLOAD_KINDS = [spec for spec in KINDS if spec.kind != "Pod"]
RICH_CONFIG = {
    "defaults": {
        "fail-non-retriable": True,
        "retriable-exit-codes": [143, 137],
        "ignore-disruptions": True,
        "backoff-limit": 4,
    },
    "guardRails": {"maxBackoffLimit": 10},
    "spotNodeLabels": {"karpenter.sh/capacity-type": ["spot"], "cloud.google.com/gke-spot": "true"},
    "namespaces": {
        "ml-research": {
            "defaults": {"non-spot-attempts": 1, "error-propagation": "earliest"},
            "guardRails": {"maxBackoffLimit": 6},
            "rollout": "audit",
        }
    },
    "kueue": {
        "waitForPodsReady": {"timeout": "10m", "recoveryTimeout": "5m"},
        "startupAllowance": "90s",
        "retryDelay": "deny",
    },
    "rollout": "enforce",
}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cert-manager": {"certManager": {"enabled": True}},
    "cert-manager-issuer": {
        "certManager": {
            "enabled": True,
            "issuerRef": {"kind": "ClusterIssuer", "name": "corp-ca", "group": "cert-manager.io"},
        }
    },
    "opt-in": {"webhook": {"optIn": {"enabled": True}}},
    "replicas-3": {
        "replicaCount": 3,
        "podDisruptionBudget": {"maxUnavailable": None, "minAvailable": 2},
    },
    "autoscaling": {"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 10}},
    "failure-policies": {
        "webhook": {
            "mutating": {"failurePolicy": "Fail", "timeoutSeconds": 10},
            "validating": {"failurePolicy": "Ignore", "timeoutSeconds": 30},
        }
    },
    # Every other workload kind switched off.
    "some-kinds": {"webhook": {"kinds": {s.chart_key: False for s in WORKLOAD_KINDS[1::2]}}},
    "pods-only": {"webhook": {"kinds": {k: k == "pods" for k in ALL_KINDS}}},
    "no-pods": {"webhook": {"kinds": {"pods": False}}},
    "excluded-namespaces": {"webhook": {"excludedNamespaces": ["monitoring", "kube-system"]}},
    "config": {"config": RICH_CONFIG},
    "kube-off": {"server": {"kube": "off"}},
    "network-policy": {
        "networkPolicy": {
            "enabled": True,
            "apiServer": {
                "cidrs": ["10.0.0.0/28", "fd00::/64"],
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                },
                "podSelector": {"matchLabels": {"component": "kube-apiserver"}},
            },
            "prometheus": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                "podSelector": {
                    "matchExpressions": [
                        {
                            "key": "app.kubernetes.io/name",
                            "operator": "In",
                            "values": ["prometheus"],
                        }
                    ]
                },
            },
        }
    },
    "metrics-off": {"metrics": {"port": 0}},
    "service-monitor": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}
    },
    "production": {
        "image": {"digest": "sha256:" + "a" * 64},
        "imagePullSecrets": [{"name": "registry"}],
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"node-role.kubernetes.io/infra": ""},
        "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "infra", "operator": "Exists"}]}
                    ]
                }
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "webhook"}},
            }
        ],
        "podAnnotations": {"example.com/team": "batch"},
        "podLabels": {"example.com/tier": "platform"},
        "commonLabels": {"example.com/owner": "platform"},
        "serviceAccount": {"name": "rpw", "annotations": {"example.com/role": "x"}},
        "server": {"workers": 4, "threads": 16, "logLevel": "debug", "extraArgs": ["--x=1"]},
    },
}


@pytest.fixture(params=sorted(VALUE_SETS))
def value_set(request) -> tuple[str, dict[str, Any]]:
    return request.param, VALUE_SETS[request.param]


# --- lint and schema validity of every rendered object -----------------------------


@pytest.mark.parametrize("name", ["defaults", "cert-manager", "opt-in", "config", "network-policy"])
def test_helm_lint_strict(helm, name):
    result = run_helm(helm, "lint", "--strict", str(CHART), values=VALUE_SETS[name])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_every_manifest_is_valid_kubernetes_1_37(helm, value_set):
    name, values = value_set
    docs = render(helm, values)
    skipped = []
    for doc in docs:
        if doc["apiVersion"].startswith(("cert-manager.io/", "monitoring.coreos.com/")):
            # cert-manager's and the Prometheus Operator's CRDs are not part of the
            # Kubernetes schemas that kubernetes_validate ships; their fields are asserted
            # in test_cert_manager_* and test_metrics_*.
            skipped.append(doc["kind"])
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = "/".join(str(p) for p in err.path)
            pytest.fail(
                f"{name}: {doc['kind']}/{doc['metadata']['name']} at {where}: {err.message}"
            )
    if values.get("certManager", {}).get("enabled"):
        assert "Certificate" in skipped
    if values.get("metrics", {}).get("serviceMonitor", {}).get("enabled"):
        assert "ServiceMonitor" in skipped
    assert set(skipped) <= {"Issuer", "ClusterIssuer", "Certificate", "ServiceMonitor"}
    if not values.get("certManager", {}).get("enabled"):
        assert not set(skipped) & {"Issuer", "Certificate"}


def test_default_objects(helm):
    docs = render(helm, {})
    full = f"{RELEASE}-retry-policy-webhook"
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == sorted(
        [
            ("PodDisruptionBudget", full),
            ("ServiceAccount", full),
            ("ConfigMap", full),
            ("ClusterRole", full),
            ("ClusterRoleBinding", full),
            ("Service", full),
            ("Deployment", full),
            ("MutatingWebhookConfiguration", f"{full}-mutating"),
            ("ValidatingWebhookConfiguration", f"{full}-validating"),
            # The controller's Lease, in the release's namespace.
            ("Role", f"{full}-lease"),
            ("RoleBinding", f"{full}-lease"),
            # Built-in certificates: hook Job with its own short-lived identity.
            ("ServiceAccount", f"{full}-certgen"),
            ("Role", f"{full}-certgen"),
            ("RoleBinding", f"{full}-certgen"),
            ("ClusterRole", f"{full}-certgen"),
            ("ClusterRoleBinding", f"{full}-certgen"),
            ("Job", f"{full}-certgen"),
            # Retry-delay gates released on delete: hook Job with its own identity.
            ("ServiceAccount", f"{full}-release-gates"),
            ("ClusterRole", f"{full}-release-gates"),
            ("ClusterRoleBinding", f"{full}-release-gates"),
            ("Job", f"{full}-release-gates"),
            # What those identities may change (tests/chart/test_policy.py).
            ("ValidatingAdmissionPolicy", f"{full}-writes"),
            ("ValidatingAdmissionPolicyBinding", f"{full}-writes"),
        ]
    )
    for doc in docs:
        if (
            doc["kind"] not in ("ClusterRole", "ClusterRoleBinding")
            and "Webhook" not in doc["kind"]
            and not doc["kind"].startswith("ValidatingAdmissionPolicy")
        ):
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]


# --- webhook configurations --------------------------------------------------------


@pytest.mark.parametrize("name", ["defaults", "failure-policies"])
def test_webhook_configuration_fields(helm, name):
    values = VALUE_SETS[name]
    docs = render(helm, values)
    settings = merged(
        {
            "mutating": {"failurePolicy": "Ignore", "timeoutSeconds": 3},
            "validating": {"failurePolicy": "Fail", "timeoutSeconds": 3},
        },
        values.get("webhook", {}),
    )
    service = one(docs, "Service")
    for kind, side, path in (
        ("MutatingWebhookConfiguration", "mutating", "/mutate"),
        ("ValidatingWebhookConfiguration", "validating", "/validate"),
    ):
        hooks = webhooks(docs, kind)
        hooks.pop(DELETIONS_HOOK, None)  # its own settings: test_pod_deletions_webhook
        assert len(hooks) == 2
        for hook in hooks.values():
            assert hook["sideEffects"] == "None"
            assert hook["admissionReviewVersions"] == ["v1"]
            assert hook["failurePolicy"] == settings[side]["failurePolicy"]
            assert hook["timeoutSeconds"] == settings[side]["timeoutSeconds"]
            assert hook["matchPolicy"] == "Equivalent"
            assert hook["clientConfig"] == {
                "service": {
                    "name": service["metadata"]["name"],
                    "namespace": NAMESPACE,
                    "path": path,
                    "port": service["spec"]["ports"][0]["port"],
                }
            }
            assert "caBundle" not in hook["clientConfig"]  # injected, never rendered
            if side == "mutating":
                assert hook["reinvocationPolicy"] == "IfNeeded"
            else:
                assert "reinvocationPolicy" not in hook


def test_webhook_names(helm):
    docs = render(helm, {})
    assert set(webhooks(docs, "MutatingWebhookConfiguration")) == {
        "workloads.mutate.retry-policy.dev",
        "pods.mutate.retry-policy.dev",
    }
    assert set(webhooks(docs, "ValidatingWebhookConfiguration")) == {
        "workloads.validate.retry-policy.dev",
        "pods.validate.retry-policy.dev",
        DELETIONS_HOOK,
    }


def _excluded(selector: dict) -> set[str]:
    exprs = [e for e in selector["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"]
    assert len(exprs) == 1 and exprs[0]["operator"] == "NotIn"
    return set(exprs[0]["values"])


@pytest.mark.parametrize("namespace", [NAMESPACE, "platform-webhooks"])
def test_namespace_selector_excludes_system_and_release_namespace(helm, namespace):
    docs = render(helm, {}, namespace=namespace)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in webhooks(docs, kind).values():
            selector = hook["namespaceSelector"]
            assert set(selector) == {"matchExpressions"}
            assert _excluded(selector) == {"kube-system", namespace}
            assert len(selector["matchExpressions"]) == 1
            assert "objectSelector" not in hook  # users could opt out with a label


def test_extra_excluded_namespaces(helm):
    docs = render(helm, VALUE_SETS["excluded-namespaces"])
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in webhooks(docs, kind).values():
            values = next(
                e["values"]
                for e in hook["namespaceSelector"]["matchExpressions"]
                if e["key"] == "kubernetes.io/metadata.name"
            )
            assert sorted(values) == ["kube-system", "monitoring", NAMESPACE]  # no duplicate


def test_opt_in_mode_requires_the_namespace_label(helm):
    docs = render(helm, VALUE_SETS["opt-in"])
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in webhooks(docs, kind).values():
            exprs = hook["namespaceSelector"]["matchExpressions"]
            assert _excluded(hook["namespaceSelector"]) == {"kube-system", NAMESPACE}
            assert {"key": "retry-policy.dev/enabled", "operator": "In", "values": ["true"]} in (
                exprs
            )
    custom = render(helm, {"webhook": {"optIn": {"enabled": True, "label": "team", "value": "a"}}})
    hook = webhooks(custom, "ValidatingWebhookConfiguration")["workloads.validate.retry-policy.dev"]
    assert {"key": "team", "operator": "In", "values": ["a"]} in hook["namespaceSelector"][
        "matchExpressions"
    ]


WORKLOAD_RESOURCES = {s.chart_key: (s.group, s.version, s.plural) for s in WORKLOAD_KINDS}
#: Kinds whose UPDATEs the mutating webhook gets too: those whose mutator evaluates an
#: UPDATE (a CronJob is a template for later Jobs: ``reevaluate_on_update``) or puts back
#: what a re-apply left out (a JobSet's, a TrainJob's: ``restore``).
MUTATED_UPDATES = tuple(
    s.plural
    for s in WORKLOAD_KINDS
    if isinstance(s.mutator, Restores) or s.mutator.reevaluate_on_update
)


def _rule_set(hook: dict) -> set[tuple[str, str, str, tuple[str, ...]]]:
    found = set()
    for rule in hook["rules"]:
        assert rule["scope"] == "Namespaced"
        for group in rule["apiGroups"]:
            for version in rule["apiVersions"]:
                for resource in rule["resources"]:
                    assert "*" not in (group, version, resource)
                    assert "/" not in resource, "subresources (status) must never be sent"
                    found.add((group, version, resource, tuple(sorted(rule["operations"]))))
    return found


@pytest.mark.parametrize("name", ["defaults", "some-kinds", "pods-only", "no-pods"])
def test_rules_list_exactly_the_enabled_kinds(helm, name):
    values = VALUE_SETS[name]
    docs = render(helm, values)
    enabled = {k: True for k in ALL_KINDS}
    enabled.update(values.get("webhook", {}).get("kinds", {}))
    expected_workloads = {WORKLOAD_RESOURCES[k] for k in WORKLOAD_RESOURCES if enabled[k]}
    both = ("CREATE", "UPDATE")
    for kind, side, workload_ops in (
        ("MutatingWebhookConfiguration", "mutate", ("CREATE",)),
        ("ValidatingWebhookConfiguration", "validate", both),
    ):
        hooks = webhooks(docs, kind)
        workloads = hooks.get(f"workloads.{side}.retry-policy.dev")
        if expected_workloads:
            assert _rule_set(workloads) == {
                (*r, both if r[2] in MUTATED_UPDATES else workload_ops) for r in expected_workloads
            }
        else:
            assert workloads is None
        pods = hooks.get(f"pods.{side}.retry-policy.dev")
        if enabled["pods"]:
            # Pods are mutated on CREATE only; validated on CREATE and (annotation) UPDATE.
            pod_ops = ("CREATE",) if side == "mutate" else ("CREATE", "UPDATE")
            assert _rule_set(pods) == {("", "v1", "pods", pod_ops)}
        else:
            assert pods is None
        deletions = hooks.pop(DELETIONS_HOOK, None)
        if side == "validate" and expected_workloads:
            assert _rule_set(deletions) == {("", "v1", "pods", ("DELETE",))}
        else:
            assert deletions is None  # (no workload with a podFailurePolicy to mark for)
        for hook in hooks.values():
            for rule in hook["rules"]:
                # matchConditions below assume `object` is never null (it is on DELETE).
                assert set(rule["operations"]) <= {"CREATE", "UPDATE"}


def _deletion_review(user: str, pod: dict, groups: list[str] | None = None) -> dict:
    return {
        "operation": "DELETE",
        "namespace": "team-a",
        "kind": {"kind": "Pod"},
        "userInfo": {"username": user, **({"groups": groups} if groups is not None else {})},
    }


KARPENTER = "system:serviceaccount:kube-system:karpenter"


def _running_pod(**status: Any) -> dict:
    return {
        "metadata": {"name": "p", "labels": {PREFIX + "ignore-disruptions": "true"}},
        "status": {"phase": "Running", **status},
    }


DISRUPTED = [{"type": "DisruptionTarget", "status": "True"}]
DELETION_SCENARIOS = [
    # (who, groups, the pod, sent): only a disruptor's deletion of a pod of a workload
    # that ignores disruptions, not yet disrupted and not yet terminal.
    (KARPENTER, None, _running_pod(), True),
    ("system:serviceaccount:karpenter:karpenter", [], _running_pod(), True),
    ("system:serviceaccount:kube-system:cluster-autoscaler", None, _running_pod(), True),
    ("alice", ["system:authenticated"], _running_pod(), False),
    ("system:serviceaccount:kube-system:generic-garbage-collector", None, _running_pod(), False),
    (KARPENTER, None, _running_pod(conditions=DISRUPTED), False),
    (KARPENTER, None, _running_pod(phase="Failed"), False),
    (KARPENTER, None, _running_pod(phase="Succeeded"), False),
    (KARPENTER, None, {"metadata": {"name": "p", "labels": {"app": "x"}}}, False),
    (KARPENTER, None, {"metadata": {"name": "p"}}, False),
    (
        KARPENTER,
        None,
        {"metadata": {"name": "p", "labels": {PREFIX + "ignore-disruptions": "true"}}},
        True,
    ),
]


@pytest.mark.parametrize(("user", "groups", "pod", "sent"), DELETION_SCENARIOS)
def test_pod_deletions_reach_the_webhook_only_from_disruptors(helm, user, groups, pod, sent):
    """The pod deletions' webhook, its CEL evaluated (cel-python) as the API server would,
    with the pod as a DELETE's oldObject (object is null); and the engine, where the chart
    sends it, asks for the mark (webhook.admission.deletions), else allows unchanged."""
    celpy = pytest.importorskip("celpy", reason="cel-python is not installed")
    docs = render(helm, {})
    hook = webhooks(docs, "ValidatingWebhookConfiguration")[DELETIONS_HOOK]
    env = celpy.Environment()
    activation = {
        "request": celpy.json_to_cel(_deletion_review(user, pod, groups)),
        "oldObject": celpy.json_to_cel(pod),
        "object": celpy.json_to_cel(None),
    }
    results = [
        bool(env.program(env.compile(c["expression"])).evaluate(activation))
        for c in hook["matchConditions"]
    ]
    assert all(results) is sent
    from webhook.admission import engine
    from webhook.admission.review import GroupVersionKind, Request
    from webhook.policy.config import Config

    stored = copy.deepcopy(pod)
    stored["metadata"].update({"namespace": "team-a", "uid": "u-1"})
    request = Request(
        "u",
        GroupVersionKind("", "v1", "Pod"),
        "DELETE",
        "team-a",
        "p",
        None,
        stored,
        user=user,
        groups=tuple(groups or ()),
    )
    verdict = engine.validate(request, Config())
    assert verdict.allowed and not verdict.patch and not verdict.warnings
    assert (verdict.deleted is not None) is sent


def test_pod_deletions_webhook_settings_and_configured_disruptors(helm):
    """Never in the way of a deletion (Ignore), a side effect that a dry run never has, the
    chart's default disruptors the loader's, and a config's replacing them."""
    from webhook.policy.config import DEFAULT_DISRUPTOR_USERS

    hook = webhooks(render(helm, {}), "ValidatingWebhookConfiguration")[DELETIONS_HOOK]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "NoneOnDryRun"
    assert hook["timeoutSeconds"] == 2 and hook["clientConfig"]["service"]["path"] == "/validate"
    (by,) = [
        c["expression"] for c in hook["matchConditions"] if c["name"] == "deleted-by-a-disruptor"
    ]
    assert json.loads(by.split(" in ", 1)[1].split(" || ")[0]) == list(DEFAULT_DISRUPTOR_USERS)
    custom = {"config": {"disruptors": {"users": ["u1"], "groups": ["ops:scalers"]}}}
    docs = render(helm, custom)
    hook = webhooks(docs, "ValidatingWebhookConfiguration")[DELETIONS_HOOK]
    (by,) = [
        c["expression"] for c in hook["matchConditions"] if c["name"] == "deleted-by-a-disruptor"
    ]
    assert '["u1"]' in by and '["ops:scalers"]' in by and KARPENTER not in by
    assert "disruptors" in _config_text(docs)  # the server's config says the same
    for off in ({"webhook": {"deletions": {"enabled": False}}}, {"server": {"kube": "off"}}):
        assert DELETIONS_HOOK not in webhooks(render(helm, off), "ValidatingWebhookConfiguration")


def test_disabling_every_kind_is_refused(helm):
    stderr = render_fails(helm, {"webhook": {"kinds": {k: False for k in ALL_KINDS}}})
    assert "enable at least one kind" in stderr


MIRROR_CEL = (
    "!has(object.metadata.annotations) || "
    "!('kubernetes.io/config.mirror' in object.metadata.annotations)"
)
HAS_POLICY_CEL = (
    "has(object.metadata.annotations) && "
    "object.metadata.annotations.exists(k, k.startsWith('retry-policy.dev/'))"
)
CREATE_HAS_POLICY_CEL = f"request.operation != 'CREATE' || ({HAS_POLICY_CEL})"
CREATE_NOT_CONTROLLED_CEL = (
    "request.operation != 'CREATE' || !has(object.metadata.ownerReferences) || "
    "!object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller)"
)
# True when a retry-policy.dev/ annotation was added or changed, or was removed.
UPDATE_CHANGES_POLICY_CEL = (
    "request.operation != 'UPDATE' || "
    "(has(object.metadata.annotations) && object.metadata.annotations.exists(k, "
    "k.startsWith('retry-policy.dev/') && k != 'retry-policy.dev/history' && "
    "(!has(oldObject.metadata.annotations) || "
    "!(k in oldObject.metadata.annotations) || "
    "oldObject.metadata.annotations[k] != object.metadata.annotations[k]))) || "
    "(has(oldObject.metadata.annotations) && oldObject.metadata.annotations.exists(k, "
    "k.startsWith('retry-policy.dev/') && k != 'retry-policy.dev/history' && "
    "(!has(object.metadata.annotations) || "
    "!(k in object.metadata.annotations))))"
)


#: The workloads' UPDATE condition of each side, by name: what each means is tested with a
#: CEL interpreter (``test_match_conditions_semantics``, its scenarios drawn from the
#: registry where a kind's retry budget or UPDATE handling decides), not pinned here.
UPDATE_CONDITION = {
    "mutate": "update-changes-retry-policy-or-leaves-it-out",
    "validate": "update-changes-retry-policy-or-job-template",
}


def test_match_conditions_structure(helm):
    docs = render(helm, {})
    mutating = webhooks(docs, "MutatingWebhookConfiguration")
    validating = webhooks(docs, "ValidatingWebhookConfiguration")
    # The expressions are pinned here; what they mean is checked by
    # test_match_conditions_semantics (with a CEL interpreter).
    # Workloads: with the built-in config nothing can change an unannotated object, so
    # only annotated CREATEs are sent; with defaults or guard rails, every CREATE is.
    for side, hooks in (("mutate", mutating), ("validate", validating)):
        update, create = hooks[f"workloads.{side}.retry-policy.dev"]["matchConditions"]
        assert update["name"] == UPDATE_CONDITION[side]
        assert update["expression"].startswith(UPDATE_CHANGES_POLICY_CEL + " || ")
        assert create == {
            "name": "create-has-retry-policy-annotation",
            "expression": CREATE_HAS_POLICY_CEL,
        }
    for values in (
        {"config": RICH_CONFIG},
        {"config": {"guardRails": {"maxBackoffLimit": 3}}},
        {"config": {"namespaces": {"ml": {"defaults": {"backoff-limit": 1}}}}},
    ):
        docs_with_config = render(helm, values)
        for kind, side in (
            ("MutatingWebhookConfiguration", "mutate"),
            ("ValidatingWebhookConfiguration", "validate"),
        ):
            hook = webhooks(docs_with_config, kind)[f"workloads.{side}.retry-policy.dev"]
            assert [c["name"] for c in hook["matchConditions"]] == [UPDATE_CONDITION[side]], values
    pod_mutate = {
        c["name"]: c["expression"]
        for c in mutating["pods.mutate.retry-policy.dev"]["matchConditions"]
    }
    assert pod_mutate == {
        "not-a-mirror-pod": MIRROR_CEL,
        "has-retry-policy-annotation": HAS_POLICY_CEL,
    }
    pod_validate = {
        c["name"]: c["expression"]
        for c in validating["pods.validate.retry-policy.dev"]["matchConditions"]
    }
    assert pod_validate == {
        "not-a-mirror-pod": MIRROR_CEL,
        "create-has-retry-policy-annotation": CREATE_HAS_POLICY_CEL,
        "create-not-controller-owned": CREATE_NOT_CONTROLLED_CEL,
        "update-changes-retry-policy-annotations": UPDATE_CHANGES_POLICY_CEL,
    }
    for hook in [*mutating.values(), *validating.values()]:
        conditions = hook.get("matchConditions", [])
        assert len(conditions) <= 64
        assert len({c["name"] for c in conditions}) == len(conditions)


# One AdmissionRequest per scenario: (operation, object, oldObject).
def _obj(annotations: dict[str, str] | None = None, **meta: Any) -> dict:
    metadata: dict[str, Any] = {"name": "x", "namespace": "team-a", **meta}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": {}}


def _cron(annotations: dict[str, str] | None, parallelism: int, suspend: bool = False) -> dict:
    obj = _obj(annotations)
    obj["kind"] = "CronJob"
    obj["spec"] = {
        "suspend": suspend,
        "jobTemplate": {"spec": {"parallelism": parallelism, "template": {"spec": {}}}},
    }
    return obj


#: The kinds whose retry budget may change on UPDATE, each with its field: an annotated
#: one's change is sent to be checked against its annotations (``check_update``).
BUDGETED = [
    (spec.kind, field.path)
    for spec in WORKLOAD_KINDS
    if (field := spec.mutator.budget_field({"metadata": {}, "spec": {}})) is not None
]


def _budget(kind: str, annotations: dict[str, str] | None, limit: int | None) -> dict:
    """A workload of ``kind`` with its retry budget where the registry says it is
    (``None``: unset)."""
    obj = _obj(annotations)
    obj["kind"] = kind
    path = dict(BUDGETED).get(kind, ("spec", "backoffLimit"))
    if limit is not None:
        node = obj
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = limit
    return obj


def _budget_scenarios() -> list[tuple]:
    """For every kind with a mutable budget: a change (or one to or from unset) of an
    annotated workload's budget is sent; an unchanged one, or an unannotated workload's,
    is not."""
    found = []
    for kind, _ in BUDGETED:
        for new, old, ours, sent in (
            (1, 3, OURS, True),
            (1, None, OURS, True),
            (None, 3, OURS, True),
            (3, 3, OURS, False),
            (1, 3, None, False),
        ):
            found.append(
                (
                    "workloads.validate",
                    "UPDATE",
                    _budget(kind, ours, new),
                    _budget(kind, ours, old),
                    sent,
                )
            )
    return found


def _jobset(annotations: dict[str, str] | None, rules: list | None, suspend: bool) -> dict:
    """A JobSet as a re-apply sends it: ``rules`` is its failurePolicy's rules."""
    obj = _obj(annotations)
    obj["kind"] = "JobSet"
    obj["spec"] = {"suspend": suspend, "replicatedJobs": [{"name": "node", "template": {}}]}
    if rules is not None:
        obj["spec"]["failurePolicy"] = {"maxRestarts": 3, "rules": rules}
    return obj


def _trainjob(patches: list | None, annotations: dict[str, str] | None = None) -> dict:
    obj = _obj(annotations)
    obj["kind"] = "TrainJob"
    obj["spec"] = {"runtimeRef": {"name": "torch"}}
    if patches is not None:
        obj["spec"]["runtimePatches"] = patches
    return obj


def _labelled(obj: dict, labels: dict[str, str]) -> dict:
    obj["metadata"]["labels"] = labels
    return obj


OURS = {PREFIX + "backoff-limit": "3"}
APPLIED = {**OURS, PREFIX + "applied": '{"backoffLimit":3}'}
OUR_RULE = {"name": "retryPolicyFailNonRetriable", "action": "FailJobSet"}
RUNTIME_RULE = {"name": "failOnDeadline", "action": "FailJobSet"}
OUR_PATCH = {"manager": "retry-policy.dev/webhook", "trainingRuntimeSpec": {}}
KUEUE_PATCH = {"manager": "kueue.x-k8s.io/manager", "trainingRuntimeSpec": {}}
MIRROR = {"kubernetes.io/config.mirror": "abc", **OURS}
JOB_OWNER = [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": True}]
OTHER_OWNER = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "v"}]
HISTORY = PREFIX + "history"
CEL_SCENARIOS = [
    # (webhook, operation, object, oldObject, sent)
    ("pods.mutate", "CREATE", _obj(OURS), None, True),
    ("pods.mutate", "CREATE", _obj({PREFIX + "applied": "{}"}), None, True),
    ("pods.mutate", "CREATE", _obj({"other.io/x": "1"}), None, False),
    ("pods.mutate", "CREATE", _obj(), None, False),
    ("pods.mutate", "CREATE", _obj(MIRROR), None, False),
    ("pods.validate", "CREATE", _obj(OURS), None, True),
    ("pods.validate", "CREATE", _obj({"a": "b"}), None, False),
    ("pods.validate", "CREATE", _obj(MIRROR), None, False),
    # A Job's pods are never denied at CREATE (the engine fails open for them): not sent
    # to the fail-closed validating webhook, but still mutated.
    ("pods.validate", "CREATE", _obj(OURS, ownerReferences=JOB_OWNER), None, False),
    ("pods.mutate", "CREATE", _obj(OURS, ownerReferences=JOB_OWNER), None, True),
    ("pods.validate", "CREATE", _obj(OURS, ownerReferences=OTHER_OWNER), None, True),
    ("pods.validate", "UPDATE", _obj({"a": "b"}, ownerReferences=JOB_OWNER), _obj(OURS), True),
    # The Job controller removing its finalizer from a pod with our annotations: skipped.
    ("pods.validate", "UPDATE", _obj(OURS, finalizers=[]), _obj(OURS, finalizers=["f"]), False),
    ("pods.validate", "UPDATE", _obj({**OURS, "a": "2"}), _obj({**OURS, "a": "1"}), False),
    ("pods.validate", "UPDATE", _obj(), _obj(), False),
    ("pods.validate", "UPDATE", _obj({PREFIX + "backoff-limit": "4"}), _obj(OURS), True),
    ("pods.validate", "UPDATE", _obj(OURS), _obj(), True),
    ("pods.validate", "UPDATE", _obj({"a": "b"}), _obj(OURS), True),
    # Built-in config: unannotated workloads cannot be changed, so they are not sent.
    ("workloads.mutate", "CREATE", _obj(), None, False),
    ("workloads.validate", "CREATE", _obj(), None, False),
    ("workloads.mutate", "CREATE", _obj(OURS), None, True),
    ("workloads.validate", "CREATE", _obj(OURS), None, True),
    ("workloads.validate", "UPDATE", _obj(OURS, labels={"x": "1"}), _obj(OURS), False),
    ("workloads.validate", "UPDATE", _obj(), _obj(), False),
    # The controller writing a workload's failure history (webhook/cluster/record.py), first
    # and again: no policy changes, so neither webhook hears of it.
    ("workloads.validate", "UPDATE", _obj({**OURS, HISTORY: "{}"}), _obj(OURS), False),
    ("workloads.mutate", "UPDATE", _obj({**OURS, HISTORY: "{}"}), _obj(OURS), False),
    (
        "workloads.validate",
        "UPDATE",
        _obj({**OURS, HISTORY: "2"}),
        _obj({**OURS, HISTORY: "1"}),
        False,
    ),
    ("workloads.validate", "UPDATE", _obj({HISTORY: "1"}), _obj({**OURS, HISTORY: "1"}), True),
    ("workloads.validate", "UPDATE", _obj({PREFIX + "backoff-limit": "9"}), _obj(OURS), True),
    ("workloads.validate", "UPDATE", _obj({PREFIX + "new": "1", **OURS}), _obj(OURS), True),
    ("workloads.validate", "UPDATE", _obj(), _obj(OURS), True),
    ("workloads.mutate", "UPDATE", _obj(OURS, labels={"x": "1"}), _obj(OURS), False),
    ("workloads.mutate", "UPDATE", _obj({PREFIX + "backoff-limit": "9"}), _obj(OURS), True),
    # CronJobs: a changed jobTemplate is sent (mutated and checked again); suspend is not.
    ("workloads.mutate", "UPDATE", _cron(OURS, 2), _cron(OURS, 1), True),
    ("workloads.validate", "UPDATE", _cron(OURS, 2), _cron(OURS, 1), True),
    ("workloads.mutate", "UPDATE", _cron(None, 2), _cron(None, 1), True),
    ("workloads.mutate", "UPDATE", _cron(OURS, 1, suspend=True), _cron(OURS, 1), False),
    ("workloads.validate", "UPDATE", _cron(OURS, 1, suspend=True), _cron(OURS, 1), False),
    # An annotated workload's retry budget changed: checked against its annotations.
    *_budget_scenarios(),
    # A JobSet's budget (maxRestarts, in its immutable failurePolicy) is not looked at.
    ("workloads.validate", "UPDATE", _budget("JobSet", OURS, 1), _budget("JobSet", OURS, 3), False),
    # The trainer's re-apply of a JobSet the policy was applied to: its atomic rules list
    # lost the webhook's rule; the mutating webhook puts it back (any spec change is sent).
    (
        "workloads.mutate",
        "UPDATE",
        _jobset(APPLIED, [RUNTIME_RULE], False),
        _jobset(APPLIED, [RUNTIME_RULE, OUR_RULE], True),
        True,
    ),
    (
        "workloads.mutate",
        "UPDATE",
        _jobset(APPLIED, [RUNTIME_RULE, OUR_RULE], False),
        _jobset(APPLIED, [RUNTIME_RULE, OUR_RULE], True),
        True,
    ),
    # ... but not a JobSet the policy was not applied to, nor a metadata-only update, and
    # the fail-closed validating webhook never gets them.
    ("workloads.mutate", "UPDATE", _jobset(OURS, [], False), _jobset(OURS, [], True), False),
    ("workloads.mutate", "UPDATE", _jobset(None, [], False), _jobset(None, [], True), False),
    (
        "workloads.mutate",
        "UPDATE",
        _labelled(_jobset(APPLIED, [OUR_RULE], True), {"a": "b"}),
        _jobset(APPLIED, [OUR_RULE], True),
        False,
    ),
    (
        "workloads.validate",
        "UPDATE",
        _jobset(APPLIED, [RUNTIME_RULE], False),
        _jobset(APPLIED, [RUNTIME_RULE, OUR_RULE], True),
        False,
    ),
    # A TrainJob UPDATE whose runtimePatches lose the webhook's entry (kubectl apply of a
    # manifest with patches of its own), or change the list: sent to be put back.
    ("workloads.mutate", "UPDATE", _trainjob([]), _trainjob([OUR_PATCH]), True),
    ("workloads.mutate", "UPDATE", _trainjob(None), _trainjob([OUR_PATCH]), True),
    (
        "workloads.mutate",
        "UPDATE",
        _trainjob([KUEUE_PATCH]),
        _trainjob([KUEUE_PATCH, OUR_PATCH]),
        True,
    ),
    # ... not when it keeps them, nor for a TrainJob the webhook left alone.
    ("workloads.mutate", "UPDATE", _trainjob([OUR_PATCH]), _trainjob([OUR_PATCH]), False),
    ("workloads.mutate", "UPDATE", _trainjob([]), _trainjob([KUEUE_PATCH]), False),
    ("workloads.mutate", "UPDATE", _trainjob(None), _trainjob(None), False),
    ("workloads.validate", "UPDATE", _trainjob([]), _trainjob([OUR_PATCH]), False),
]


@pytest.mark.parametrize(("webhook", "operation", "obj", "old", "sent"), CEL_SCENARIOS)
def test_match_conditions_semantics(helm, webhook, operation, obj, old, sent):
    """Evaluates the rendered CEL with a CEL interpreter (cel-python, when installed)."""
    celpy = pytest.importorskip("celpy", reason="cel-python is not installed")
    docs = render(helm, {})
    kind = (
        "MutatingWebhookConfiguration" if ".mutate" in webhook else "ValidatingWebhookConfiguration"
    )
    hook = webhooks(docs, kind)[webhook + ".retry-policy.dev"]
    env = celpy.Environment()
    activation = {
        "request": celpy.json_to_cel(
            {
                "operation": operation,
                "namespace": "team-a",
                "kind": {"kind": obj.get("kind") or ("Pod" if "pods" in webhook else "Job")},
            }
        ),
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
    }
    results = []
    for condition in hook.get("matchConditions", []):
        value = env.program(env.compile(condition["expression"])).evaluate(activation)
        assert isinstance(value, celpy.celtypes.BoolType), (condition["name"], value)
        results.append(bool(value))
    assert all(results) is sent


def test_skipped_requests_are_ones_the_engine_allows_unchanged():
    """Mirror pods aside (never touched, on purpose), the matchConditions only skip
    requests the webhook would allow without a change. If the engine ever starts to deny
    or patch one of these, this test names the chart condition that must change too."""
    from webhook.admission import engine
    from webhook.admission.review import GroupVersionKind, Request
    from webhook.policy.config import Config

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "uid": "1"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]},
    }
    bad = {PREFIX + "non-spot-attempts": "lots", PREFIX + "backoff-limit": "x"}

    def review(op: str, obj: dict, old: dict | None = None, kind: str = "Pod") -> Request:
        group = "" if kind == "Pod" else "batch"
        version = "v1"
        return Request("u", GroupVersionKind(group, version, kind), op, "team-a", "p", obj, old)

    def with_meta(base: dict, **meta: Any) -> dict:
        out = copy.deepcopy(base)
        out["metadata"].update(meta)
        return out

    # Sanity: a bare pod with bad annotations IS denied (so the checks below mean something).
    assert not engine.validate(review("CREATE", with_meta(pod, annotations=bad)), Config()).allowed
    # create-not-controller-owned: a Job's pod is never denied at CREATE.
    owned = with_meta(pod, annotations=bad, ownerReferences=JOB_OWNER)
    assert engine.validate(review("CREATE", owned), Config()).allowed
    # has-retry-policy-annotation: a pod without our annotations is left alone.
    plain = with_meta(pod, annotations={"other.io/x": "1"})
    assert engine.mutate(review("CREATE", plain), Config()).patch in (None, [])
    assert engine.validate(review("CREATE", plain), Config()).allowed
    # update-changes-retry-policy-annotations: an UPDATE that keeps them is allowed silently.
    for kind, obj in (("Pod", pod), ("Job", {**pod, "kind": "Job", "apiVersion": "batch/v1"})):
        old = with_meta(obj, annotations=dict(bad))
        new = with_meta(obj, annotations=dict(bad), labels={"x": "1"})
        verdict = engine.validate(review("UPDATE", new, old, kind), Config())
        assert verdict.allowed and not verdict.warnings, kind
        # The mutating webhook gets UPDATEs only of CronJobs: it does nothing on others.
        assert engine.mutate(review("UPDATE", new, old, kind), Config()).patch in (None, [])
    # create-has-retry-policy-annotation on workloads (built-in config only): an
    # unannotated Job is left alone by both webhooks.
    plain_job = {**pod, "kind": "Job", "apiVersion": "batch/v1"}
    plain_job = {**plain_job, "spec": {"template": {"spec": pod["spec"]}}}
    assert engine.mutate(review("CREATE", plain_job, kind="Job"), Config()).patch in (None, [])
    assert engine.validate(review("CREATE", plain_job, kind="Job"), Config()).allowed
    # update-changes-retry-policy-or-job-template: a CronJob UPDATE that keeps both its
    # annotations and its jobTemplate (suspend) is left alone by both webhooks.
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c", "namespace": "team-a", "annotations": dict(bad)},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": pod["spec"]}}},
    }
    suspended = copy.deepcopy(cron)
    suspended["spec"]["suspend"] = True
    update = review("UPDATE", suspended, cron, "CronJob")
    assert engine.validate(update, Config()).allowed
    assert engine.mutate(update, Config()).patch in (None, [])
    # update-changes-retry-policy-or-leaves-it-out: a JobSet UPDATE that keeps its spec
    # (labels), or of a JobSet the policy was not applied to, and a TrainJob UPDATE that
    # keeps its runtimePatches: the mutating webhook would change nothing.
    jobset_group = GroupVersionKind("jobset.x-k8s.io", "v1alpha2", "JobSet")
    trainer_group = GroupVersionKind("trainer.kubeflow.org", "v1alpha1", "TrainJob")
    js = _jobset(APPLIED, [RUNTIME_RULE], False)
    js["spec"]["replicatedJobs"][0]["template"] = {"spec": {"template": pod["spec"]}}
    for new, old in (
        (_labelled(copy.deepcopy(js), {"x": "1"}), js),
        (_jobset(OURS, [RUNTIME_RULE], False), _jobset(OURS, [RUNTIME_RULE, OUR_RULE], True)),
    ):
        request = Request("u", jobset_group, "UPDATE", "team-a", "x", new, old)
        assert engine.mutate(request, Config()).patch in (None, [])
    kept = _trainjob([OUR_PATCH], OURS)
    request = Request("u", trainer_group, "UPDATE", "team-a", "x", kept, copy.deepcopy(kept))
    assert engine.mutate(request, Config()).patch in (None, [])


# --- the Deployment ----------------------------------------------------------------


def test_deployment_is_hardened(helm):
    docs = render(helm, {})
    pod = deployment_pod(docs)["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["runAsGroup"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    ctx = container(docs)["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx.get("privileged", False) is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    resources = container(docs)["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) >= {"memory", "cpu"}
    # A core per worker: a smaller CPU limit throttles the default workers under load.
    workers = yaml.safe_load((CHART / "values.yaml").read_text())["server"]["workers"]
    assert float(resources["limits"]["cpu"]) >= workers
    assert (
        pod["serviceAccountName"]
        == one(docs, "ServiceAccount", f"{RELEASE}-retry-policy-webhook")["metadata"]["name"]
    )
    assert pod["automountServiceAccountToken"] is True  # the attempt cache reads the API
    assert one(docs, "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_container_args_and_image(helm):
    docs = render(helm, {})
    c = container(docs)
    args = c["args"]
    assert args[0] == "serve"
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert flags == {
        "--config": "/etc/retry-webhook/config.yaml",
        "--cert-dir": "/etc/retry-webhook/tls",
        "--port": "8443",
        "--kube": "incluster",
        "--service": one(docs, "Service")["metadata"]["name"],
        "--namespace": NAMESPACE,
        "--workers": "2",
        "--threads": "8",
        "--header-timeout": "10",
        "--body-timeout": "10",
        "--max-connections": "1024",
        "--lookup-timeout": "0.5",
        "--log-level": "info",
        "--metrics-port": "9090",
        "--cache-sync-timeout": "10",
        "--lease-name": "retry-policy-webhook-controller",
        "--lease-namespace": NAMESPACE,
        "--lease-duration": "15",
        "--renew-deadline": "10",
        "--retry-period": "2",
        "--kube-api-qps": "50",
        "--kube-api-burst": "100",
        "--peer-mark-limit": "1000",
    }
    # Every flag is one the server knows, with a value it accepts.
    from webhook.cli import build_parser

    parsed = build_parser().parse_args(args)
    assert (parsed.header_timeout, parsed.body_timeout, parsed.max_connections) == (10, 10, 1024)
    assert (parsed.kube_api_qps, parsed.kube_api_burst) == (50, 100)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert c["image"] == f"ghcr.io/retry-policy/retry-policy-webhook:{chart['appVersion']}"
    assert "command" not in c  # the image's ENTRYPOINT is retry-webhook
    digest = container(render(helm, VALUE_SETS["production"]))["image"]
    assert digest == "ghcr.io/retry-policy/retry-policy-webhook@sha256:" + "a" * 64


def test_volumes_secret_read_only_config_and_tmp(helm):
    docs = render(helm, {})
    c = container(docs)
    pod = deployment_pod(docs)["spec"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    etc = mounts["/etc/retry-webhook"]
    assert etc["readOnly"] is True
    assert "subPath" not in etc  # a renewed certificate must reach the running pod
    sources = volumes[etc["name"]]["projected"]["sources"]
    secret = next(s["secret"] for s in sources if "secret" in s)
    config = next(s["configMap"] for s in sources if "configMap" in s)
    assert secret["name"] == f"{RELEASE}-retry-policy-webhook-tls"
    assert {i["key"]: i["path"] for i in secret["items"]} == {
        "tls.crt": "tls/tls.crt",
        "tls.key": "tls/tls.key",
    }  # the CA key never enters the webhook pod
    assert config["name"] == one(docs, "ConfigMap")["metadata"]["name"]
    assert {i["key"]: i["path"] for i in config["items"]} == {"config.yaml": "config.yaml"}
    assert volumes[etc["name"]]["projected"]["defaultMode"] == 0o440
    # The paths the server is told match what is mounted.
    assert "/etc/retry-webhook/" + "config.yaml" in c["args"]
    tmp = mounts["/tmp"]
    assert "emptyDir" in volumes[tmp["name"]]
    assert not tmp.get("readOnly", False)


def test_probes_use_https_on_the_webhook_port(helm):
    docs = render(helm, {})
    c = container(docs)
    port = next(p for p in c["ports"] if p["name"] == "https")
    assert port["containerPort"] == 8443
    expected = {
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
        "startupProbe": "/healthz",
    }
    for probe, path in expected.items():
        get = c[probe]["httpGet"]
        assert get == {"path": path, "port": "https", "scheme": "HTTPS"}, probe
    assert c["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}
    other_port = container(render(helm, {"server": {"port": 9443}}))
    assert other_port["ports"][0]["containerPort"] == 9443
    assert other_port["args"][other_port["args"].index("--port") + 1] == "9443"


def test_replicas_spread_and_disruption_budget(helm):
    docs = render(helm, {})
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    pod = deployment["spec"]["template"]["spec"]
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert spread["kubernetes.io/hostname"]["labelSelector"]["matchLabels"] == selector
    assert spread["kubernetes.io/hostname"]["maxSkew"] == 1
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    three = render(helm, VALUE_SETS["replicas-3"])
    assert one(three, "Deployment")["spec"]["replicas"] == 3
    pdb3 = one(three, "PodDisruptionBudget")["spec"]
    assert pdb3["minAvailable"] == 2 and "maxUnavailable" not in pdb3
    assert "podDisruptionBudget" in render_fails(
        helm, {"podDisruptionBudget": {"maxUnavailable": 1, "minAvailable": 1}}
    )


def test_autoscaling_owns_the_replica_count(helm):
    """Off by default; when on, the HPA scales the webhook's Deployment on absolute CPU and
    the Deployment has no replica count of its own (a `helm upgrade` would reset the
    HPA's choice to it)."""
    assert objects(render(helm, {}), "HorizontalPodAutoscaler") == []
    docs = render(helm, VALUE_SETS["autoscaling"])
    deployment = one(docs, "Deployment")
    assert "replicas" not in deployment["spec"]
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 10)
    [metric] = hpa["spec"]["metrics"]
    assert metric["resource"] == {
        "name": "cpu",
        "target": {"type": "AverageValue", "averageValue": "1"},
    }
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    custom = render(helm, merged(VALUE_SETS["autoscaling"], {"autoscaling": {"targetCPU": "1.5"}}))
    target = one(custom, "HorizontalPodAutoscaler")["spec"]["metrics"][0]["resource"]["target"]
    assert target["averageValue"] == "1.5"
    error = render_fails(
        helm, {"autoscaling": {"enabled": True, "minReplicas": 4, "maxReplicas": 3}}
    )
    assert "minReplicas (4) must not be more than maxReplicas (3)" in error


def test_network_policy_admits_only_the_api_server_and_prometheus(helm):
    """Off by default. On: the webhook pods (exactly the Deployment's) take ingress only
    from the API server's addresses and selectors, on the HTTPS port, and from
    Prometheus on the metrics port; egress is left alone (the attempt cache calls the
    API server)."""
    assert objects(render(helm, {}), "NetworkPolicy") == []
    docs = render(helm, VALUE_SETS["network-policy"])
    policy = one(docs, "NetworkPolicy")
    pod_labels = deployment_pod(docs)["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert selector == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    api = VALUE_SETS["network-policy"]["networkPolicy"]["apiServer"]
    prometheus = VALUE_SETS["network-policy"]["networkPolicy"]["prometheus"]
    webhook_rule, metrics_rule = policy["spec"]["ingress"]
    assert webhook_rule["ports"] == [{"protocol": "TCP", "port": 8443}]
    assert webhook_rule["from"] == [
        {"ipBlock": {"cidr": "10.0.0.0/28"}},
        {"ipBlock": {"cidr": "fd00::/64"}},
        {"namespaceSelector": api["namespaceSelector"], "podSelector": api["podSelector"]},
    ]
    assert metrics_rule["ports"] == [{"protocol": "TCP", "port": 9090}]
    assert metrics_rule["from"] == [
        {
            "namespaceSelector": prometheus["namespaceSelector"],
            "podSelector": prometheus["podSelector"],
        }
    ]
    # The Service sends the API server to the port the policy opens.
    service = one(docs, "Service")
    https = next(p for p in service["spec"]["ports"] if p["port"] == 443)
    assert https["targetPort"] in ("https", 8443)
    # Only CIDRs, no Prometheus: one rule; the metrics port admits no one.
    only_cidrs = {"networkPolicy": {"enabled": True, "apiServer": {"cidrs": ["192.0.2.0/24"]}}}
    [rule] = one(render(helm, only_cidrs), "NetworkPolicy")["spec"]["ingress"]
    assert rule["from"] == [{"ipBlock": {"cidr": "192.0.2.0/24"}}]
    moved = merged(VALUE_SETS["network-policy"], {"server": {"port": 9443}, "metrics": {"port": 0}})
    [rule] = one(render(helm, moved), "NetworkPolicy")["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9443}]


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        ({"enabled": True}, "needs networkPolicy.apiServer.cidrs"),
        (
            {"enabled": True, "apiServer": {"podSelector": {"matchLabels": {"a": "b"}}}},
            "networkPolicy.apiServer.podSelector needs a namespaceSelector",
        ),
        (
            {
                "enabled": True,
                "apiServer": {"cidrs": ["10.0.0.1/32"]},
                "prometheus": {"podSelector": {"matchLabels": {"app": "prometheus"}}},
            },
            "networkPolicy.prometheus.podSelector needs a namespaceSelector",
        ),
    ],
)
def test_a_network_policy_that_would_shut_out_its_callers_is_refused(helm, policy, error):
    assert error in render_fails(helm, {"networkPolicy": policy})


def _cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_the_cpu_defaults_are_the_benchmarks(helm):
    """The CPU request covers what a pod used for 500 reviews a second in the committed
    benchmark run (any stream), and the autoscaler's target is half of what the default
    workers can use (one core each), so a pod is added well before they saturate."""
    latest = json.loads((ROOT / "benchmarks" / "results" / "latest.json").read_text())
    used = [
        case["fixed_500rps"]["webhook"]["cpu_cores"]
        for case in latest["https"]["cases"].values()
        if "cpu_cores" in case["fixed_500rps"]["webhook"]
    ]
    assert used, "the committed benchmark run records no cores at 500 req/s"
    webhook = container(render(helm, {}))
    resources = webhook["resources"]
    assert _cores(resources["requests"]["cpu"]) >= max(used)
    flags = dict(zip(webhook["args"][1::2], webhook["args"][2::2], strict=False))
    workers = int(flags["--workers"])
    hpa = one(render(helm, VALUE_SETS["autoscaling"]), "HorizontalPodAutoscaler")
    target = hpa["spec"]["metrics"][0]["resource"]["target"]["averageValue"]
    assert _cores(target) == workers / 2
    assert _cores(resources["limits"]["cpu"]) == workers


def test_scheduling_values_pass_through(helm):
    values = VALUE_SETS["production"]
    docs = render(helm, values)
    template = deployment_pod(docs)
    pod = template["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["affinity"] == values["affinity"]
    assert pod["topologySpreadConstraints"] == values["topologySpreadConstraints"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["serviceAccountName"] == "rpw"
    assert template["metadata"]["annotations"]["example.com/team"] == "batch"
    assert "checksum/config" in template["metadata"]["annotations"]
    assert template["metadata"]["labels"]["example.com/tier"] == "platform"
    for doc in docs:
        assert doc["metadata"]["labels"]["example.com/owner"] == "platform", doc["kind"]
    args = container(docs)["args"]
    assert args[args.index("--workers") + 1] == "4"
    assert args[args.index("--log-level") + 1] == "debug"
    assert args[-1] == "--x=1"
    defaults = deployment_pod(render(helm, {}))["spec"]
    assert "priorityClassName" not in defaults and "nodeSelector" not in defaults


def test_service_routes_443_to_the_webhook_pods_only(helm):
    docs = render(helm, {})
    service = one(docs, "Service")
    assert service["spec"]["type"] == "ClusterIP"
    port = next(p for p in service["spec"]["ports"] if p["name"] == "https")
    assert (port["port"], port["targetPort"]) == (443, "https")
    selector = service["spec"]["selector"]
    assert selector.items() <= deployment_pod(docs)["metadata"]["labels"].items()
    for job in objects(docs, "Job"):  # never route to a hook Job
        assert not selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()


# --- RBAC --------------------------------------------------------------------------


def _roles(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] in ("Role", "ClusterRole")]


def test_rbac_has_no_wildcards_and_scopes_write_verbs(helm, value_set):
    _, values = value_set
    docs = render(helm, values)
    for role in _roles(docs):
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                assert not any("*" in item for item in rule.get(field, [])), (role, rule)
            writes = set(rule["verbs"]) & WRITE_VERBS
            if not writes:
                continue
            if rule.get("resourceNames"):
                continue
            # The exceptions: creates, which Kubernetes cannot scope by name (the TLS Secret,
            # only in the certificate hook's namespaced Role; the controller's Lease, only
            # in the release's namespace), and those in UNSCOPED_WRITES.
            if (rule["resources"], sorted(writes)) in UNSCOPED_WRITES:
                continue
            assert writes == {"create"}, rule
            assert role["kind"] == "Role" and role["metadata"]["namespace"] == NAMESPACE
            if rule["resources"] == ["secrets"]:
                assert hook_events(role), "the unscoped create must only exist during the hook"
            else:
                assert rule["resources"] == ["leases"], rule
    for binding in [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]:
        roles = {(r["kind"], r["metadata"]["name"]) for r in _roles(docs)}
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in roles
        assert hook_events(binding) == hook_events(
            one(docs, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        )


def test_webhook_identity_can_only_read_what_the_attempt_cache_needs(helm):
    docs = render(helm, {})
    full = f"{RELEASE}-retry-policy-webhook"
    role = one(docs, "ClusterRole", full)
    reads = [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]},
        # Pods: the failed-pod watch; read before marked (budgets, disruptions by deletion);
        # retry-delay gates removed (webhook/controller/gates.py); a pod that used its
        # restarts in place given a deadline (webhook/controller/restarts.py).
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "list", "watch", "patch"],
        },
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        # The controller's record of a workload's failures (webhook/controller/recorder.py),
        # on Jobs and JobSets; the workers read JobSets' (webhook/cluster/record.py), and a
        # JobSet to tell its TrainJob (Events).
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["patch"]},
    ]
    # peer-disruptions on a JobSet: FailureTarget on a disrupted pod's child Job
    # (webhook/kinds/jobset/peers.py); only where JobSets are written.
    job_status = {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["patch"]}
    jobsets = {
        "apiGroups": ["jobset.x-k8s.io"],
        "resources": ["jobsets"],
        "verbs": ["get", "list", "watch", "patch"],
    }
    # LimitRanges (webhook/cluster/limits.py) and Nodes (webhook/cluster/nodes.py):
    # watch-backed, never read per pod.
    bounds = {"apiGroups": [""], "resources": ["limitranges", "nodes"], "verbs": ["list", "watch"]}
    # The failure verdicts (webhook/controller/verdicts.py): a pod's Node read when the
    # taint manager evicted it (is the node lost?).
    node = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
    attempts = [*reads, job_status, jobsets, bounds, node]
    # The runtime cache (webhook/kinds/trainjob/runtimes.py): list+watch, and GET on a miss.
    runtimes = {
        "apiGroups": ["trainer.kubeflow.org"],
        "resources": ["trainingruntimes", "clustertrainingruntimes"],
        "verbs": ["get", "list", "watch"],
    }
    # Events (webhook/cluster/events.py): written in the workload's namespace; a failed
    # pod's listed by the controller (an Xid, a category on Events); a JobSet read to tell
    # its TrainJob; a failed Job's CronJob read by the controller, for the record of what
    # the webhook applied (webhook/controller/failedjobs.py).
    events = {
        "apiGroups": ["events.k8s.io"],
        "resources": ["events"],
        "verbs": ["get", "list", "create", "update"],
    }
    cronjobs = {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": ["get"]}
    assert role["rules"] == [*attempts, runtimes, events, cronjobs]
    no_trainjobs = render(helm, {"webhook": {"kinds": {"trainJobs": False}}})
    assert one(no_trainjobs, "ClusterRole", full)["rules"] == [*attempts, events, cronjobs]
    fewer = {"trainJobs": False, "jobSets": False, "cronJobs": False}
    narrow = render(helm, {"webhook": {"kinds": fewer}})
    assert one(narrow, "ClusterRole", full)["rules"] == [*reads, bounds, node, events]
    no_controller = render(helm, {"controller": {"enabled": False}})
    assert cronjobs not in one(no_controller, "ClusterRole", full)["rules"]
    assert node not in one(no_controller, "ClusterRole", full)["rules"]
    binding = one(docs, "ClusterRoleBinding", full)
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": deployment_pod(docs)["spec"]["serviceAccountName"],
            "namespace": NAMESPACE,
        }
    ]
    # The webhook pods write nothing but the controller's Lease, in their own namespace
    # (and what UNSCOPED_WRITES lists).
    sa = deployment_pod(docs)["spec"]["serviceAccountName"]
    lease = f"{full}-lease"
    for b in [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]:
        if any(s["name"] == sa for s in b["subjects"]) and b["roleRef"]["name"] != lease:
            granted = one(docs, b["roleRef"]["kind"], b["roleRef"]["name"])
            assert not any(
                set(r["verbs"]) & WRITE_VERBS
                and (r["resources"], sorted(set(r["verbs"]) & WRITE_VERBS)) not in UNSCOPED_WRITES
                for r in granted["rules"]
            )
    assert one(docs, "Role", lease)["metadata"]["namespace"] == NAMESPACE
    assert one(docs, "Role", lease)["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["retry-policy-webhook-controller"],
            "verbs": ["get", "update"],
        },
    ]
    args = container(docs)["args"]
    assert args[args.index("--lease-name") + 1] == "retry-policy-webhook-controller"
    assert args[args.index("--lease-namespace") + 1] == NAMESPACE
    off = render(helm, {"controller": {"enabled": False}})
    assert "--no-controller" in container(off)["args"]
    assert [d for d in off if d["metadata"]["name"] == lease] == []
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]} not in one(
        off, "ClusterRole", full
    )["rules"]
    off = render(helm, VALUE_SETS["kube-off"])
    assert [d for d in off if d["kind"] == "ClusterRole" and not hook_events(d)] == []
    assert [d for d in off if d["kind"] == "Role" and not hook_events(d)] == []
    assert deployment_pod(off)["spec"]["automountServiceAccountToken"] is False


# --- certificates ------------------------------------------------------------------

CERTGEN_HOOKS = {"pre-install", "pre-upgrade", "post-install", "post-upgrade"}


def test_builtin_certificates_hook_job(helm):
    docs = render(helm, {})
    full = f"{RELEASE}-retry-policy-webhook"
    job = one(docs, "Job", f"{full}-certgen")
    assert hook_events(job) == CERTGEN_HOOKS
    policy = set(job["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(","))
    assert policy == {"before-hook-creation", "hook-succeeded"}
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["args"] == [
        "certs",
        "--in-cluster",
        "--secret",
        f"{full}-tls",
        "--namespace",
        NAMESPACE,
        "--service",
        one(docs, "Service")["metadata"]["name"],
        "--mutating-webhook-config",
        one(docs, "MutatingWebhookConfiguration")["metadata"]["name"],
        "--validating-webhook-config",
        one(docs, "ValidatingWebhookConfiguration")["metadata"]["name"],
        "--days",
        "3650",
        "--renew-before-days",
        "30",
    ]
    assert c["image"] == container(docs)["image"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    sa = job["spec"]["template"]["spec"]["serviceAccountName"]
    assert sa == f"{full}-certgen" != deployment_pod(docs)["spec"]["serviceAccountName"]
    # Its identity exists only around the hook, and before the Job.
    job_weight = int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    for kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        obj = one(docs, kind, f"{full}-certgen")
        assert hook_events(obj) == CERTGEN_HOOKS, kind
        assert int(obj["metadata"]["annotations"]["helm.sh/hook-weight"]) < job_weight, kind
        assert "hook-succeeded" in obj["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    role = one(docs, "Role", f"{full}-certgen")
    scoped = [r for r in role["rules"] if r.get("resourceNames")]
    assert scoped == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [f"{full}-tls"],
            "verbs": ["get", "update", "patch"],
        }
    ]
    cluster_role = one(docs, "ClusterRole", f"{full}-certgen")
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations"],
            "resourceNames": [f"{full}-mutating"],
            "verbs": ["get", "patch"],
        },
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": [f"{full}-validating"],
            "verbs": ["get", "patch"],
        },
    ]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert "cert-manager.io/inject-ca-from" not in (
            one(docs, kind)["metadata"].get("annotations") or {}
        )


def test_release_gates_hook_job(helm):
    """Deleting the release removes every retry-delay gate (``retry-webhook
    release-gates``), before and after the delete; with the controller off, after every
    install and upgrade too. Its identity may list and patch pods, and lives only around
    the hook."""
    docs = render(helm, {})
    full = f"{RELEASE}-retry-policy-webhook"
    name = f"{full}-release-gates"
    job = one(docs, "Job", name)
    assert hook_events(job) == {"pre-delete", "post-delete"}
    policy = set(job["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(","))
    assert policy == {"before-hook-creation", "hook-succeeded"}
    pod_spec = job["spec"]["template"]["spec"]
    (c,) = pod_spec["containers"]
    assert c["command"] == ["/bin/sh", "-c"]  # never fails: tests/chart/test_hooks.py
    assert "retry-webhook release-gates --all-namespaces" in c["args"][0]
    assert c["image"] == container(docs)["image"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod_spec["serviceAccountName"] == name
    assert pod_spec["restartPolicy"] == "Never"
    assert job["spec"]["activeDeadlineSeconds"] == 120
    job_weight = int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        obj = one(docs, kind, name)
        assert hook_events(obj) == hook_events(job), kind
        assert int(obj["metadata"]["annotations"]["helm.sh/hook-weight"]) < job_weight, kind
    assert one(docs, "ClusterRole", name)["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}
    ]
    for values in ({"controller": {"enabled": False}}, VALUE_SETS["kube-off"]):
        off = one(render(helm, values), "Job", name)
        assert hook_events(off) == {"pre-delete", "post-delete", "post-install", "post-upgrade"}


def test_cert_manager_mode(helm):
    docs = render(helm, VALUE_SETS["cert-manager"])
    full = f"{RELEASE}-retry-policy-webhook"
    # No certificate hook: only the one that releases retry-delay gates on delete.
    assert [j["metadata"]["name"] for j in objects(docs, "Job")] == [f"{full}-release-gates"]
    assert [r["metadata"]["name"] for r in objects(docs, "Role")] == [f"{full}-lease"]
    assert all(not hook_events(d) or d["metadata"]["name"] == f"{full}-release-gates" for d in docs)
    certs = {d["metadata"]["name"]: d for d in objects(docs, "Certificate")}
    issuers = {d["metadata"]["name"]: d for d in objects(docs, "Issuer")}
    assert issuers[f"{full}-selfsigned"]["spec"] == {"selfSigned": {}}
    ca = certs[f"{full}-ca"]["spec"]
    assert ca["isCA"] is True
    assert ca["issuerRef"]["name"] == f"{full}-selfsigned"
    assert issuers[f"{full}-ca"]["spec"] == {"ca": {"secretName": ca["secretName"]}}
    serving = certs[full]
    assert serving["metadata"]["namespace"] == NAMESPACE
    spec = serving["spec"]
    assert spec["issuerRef"]["name"] == f"{full}-ca"
    service = one(docs, "Service")["metadata"]["name"]
    assert f"{service}.{NAMESPACE}.svc" in spec["dnsNames"]
    assert f"{service}.{NAMESPACE}.svc.cluster.local" in spec["dnsNames"]
    assert "server auth" in spec["usages"]
    sources = deployment_pod(docs)["spec"]["volumes"][0]["projected"]["sources"]
    assert next(s["secret"]["name"] for s in sources if "secret" in s) == spec["secretName"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = one(docs, kind)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{full}"
    external = render(helm, VALUE_SETS["cert-manager-issuer"])
    assert objects(external, "Issuer") == []
    (cert,) = objects(external, "Certificate")
    assert cert["spec"]["issuerRef"] == {
        "kind": "ClusterIssuer",
        "name": "corp-ca",
        "group": "cert-manager.io",
    }


# --- config ------------------------------------------------------------------------


def _config_text(docs: list[dict]) -> str:
    return one(docs, "ConfigMap")["data"]["config.yaml"]


def _checksum(docs: list[dict]) -> str:
    return deployment_pod(docs)["metadata"]["annotations"]["checksum/config"]


def test_config_checksum_rolls_the_pods(helm):
    base = render(helm, {})
    assert re.fullmatch(r"[0-9a-f]{64}", _checksum(base))
    assert _checksum(base) == _checksum(render(helm, {"replicaCount": 3}))
    with_config = render(helm, VALUE_SETS["config"])
    assert _checksum(with_config) != _checksum(base)
    tweaked = merged(VALUE_SETS["config"], {"config": {"guardRails": {"maxBackoffLimit": 11}}})
    assert _checksum(render(helm, tweaked)) != _checksum(with_config)


def _check_config(text: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("retry-webhook")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "webhook.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(text, encoding="utf-8")
        return subprocess.run(
            [*command, "check-config", str(path)],
            capture_output=True,
            text=True,
            timeout=scaled(60),
            check=False,
        )


@pytest.mark.parametrize("name", ["defaults", "config"])
def test_rendered_config_passes_the_real_config_loader(helm, name):
    text = _config_text(render(helm, VALUE_SETS[name]))
    assert yaml.safe_load(text) == VALUE_SETS[name].get("config", {})
    result = _check_config(text)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = "0 cluster defaults" if name == "defaults" else "4 cluster defaults"
    assert expected in result.stdout
    if name == "config":  # (the namespace's rollout over the cluster's)
        assert "rollout in namespace ml-research: audit\n" in result.stdout
        assert "rollout in every other namespace: enforce\n" in result.stdout


def test_semantic_config_errors_are_left_to_the_loader(helm):
    """The schema checks shape and types; the loader checks meaning (here: a default above
    its guard rail). The chart renders it, and check-config rejects it."""
    bad = {"config": {"defaults": {"backoff-limit": 12}, "guardRails": {"maxBackoffLimit": 5}}}
    result = _check_config(_config_text(render(helm, bad)))
    assert result.returncode == 1
    assert "maxBackoffLimit=5" in result.stderr


def test_config_categories_reach_the_loader_and_the_schema_refuses_bad_ones(helm):
    """``config.categories`` (``definitions/categories``): a good entry renders into
    config.yaml as given and the real loader takes it (a default names it); a name that
    cannot be a condition's, or a match key the classifier does not know, is refused."""
    good = {
        "name": "NCCLTimeout",
        "hint": "a collective timed out",
        "match": {"terminationMessage": "NCCL.*[Tt]imeout", "exitCodes": [3]},
    }
    values = {"config": {"categories": [good], "defaults": {"free-categories": "NCCLTimeout"}}}
    text = _config_text(render(helm, values))
    assert yaml.safe_load(text)["categories"] == [good]
    result = _check_config(text)
    assert result.returncode == 0, result.stdout + result.stderr
    bad = {
        "/config/categories/0/name": {**good, "name": "bad name!"},
        "/config/categories/0/match": {**good, "match": {"bogus": ["x"]}},
    }
    for where, entry in bad.items():
        stderr = render_fails(helm, {"config": {"categories": [entry]}})
        assert SCHEMA_ERROR in stderr and f"at '{where}'" in stderr, stderr


def test_install_md_checks_a_values_file_as_the_chart_renders_it(helm, tmp_path):
    """INSTALL.md's recipe, run as written (with no YAML tool between helm and
    check-config): a good values file passes, one whose meaning is wrong fails with its
    problem, one the schema refuses fails on the empty pipe."""
    text = (ROOT / "docs" / "INSTALL.md").read_text()
    recipe = text.split("check the meaning too before you upgrade:\n\n```sh\n", 1)[1]
    recipe = recipe.split("```", 1)[0].replace("\\\n", " ").strip()
    assert "yq" not in recipe
    binaries = f"{Path(helm).parent}{os.pathsep}{Path(sys.executable).parent}"
    cases = {
        "good": ({"config": {"defaults": {"backoff-limit": 3}}}, 0, "1 cluster defaults"),
        "meaning": (
            {"config": {"defaults": {"backoff-limit": 12}, "guardRails": {"maxBackoffLimit": 5}}},
            1,
            "maxBackoffLimit=5",
        ),
        "schema": ({"config": {"defaults": {"backoff-limit": "x"}}}, 1, "stdin is empty"),
    }
    for name, (values, code, said) in cases.items():
        (tmp_path / "my-values.yaml").write_text(yaml.safe_dump(values))
        done = subprocess.run(
            ["/bin/sh", "-c", recipe.replace("charts/", f"{ROOT}/charts/")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, "PATH": f"{binaries}{os.pathsep}{os.environ['PATH']}"},
            timeout=120,
            check=False,
        )
        assert done.returncode == code, (name, done.stdout, done.stderr)
        assert said in done.stdout + done.stderr, name


def test_schema_knows_exactly_the_config_keys_of_the_loader():
    from webhook.policy import config as loader
    from webhook.policy.model import KEYS

    schema = json.loads((CHART / "values.schema.json").read_text())
    config = schema["properties"]["config"]
    assert tuple(config["properties"]) == loader._TOP_KEYS
    ns_props = config["properties"]["namespaces"]["additionalProperties"]["properties"]
    assert tuple(ns_props) == loader._NS_KEYS
    definitions = schema["definitions"]
    assert tuple(definitions["guardRails"]["properties"]) == loader._GUARD_KEYS
    settable = {name for name, spec in KEYS.items() if spec.settable_default}
    assert set(definitions["policyDefaults"]["properties"]) == settable


# --- values schema -----------------------------------------------------------------

BAD_VALUES = [
    ({"webhook": {"mutating": {"failurePolicy": "Maybe"}}}, "/webhook/mutating/failurePolicy"),
    ({"webhook": {"validating": {"failurePolicy": "fail"}}}, "/webhook/validating/failurePolicy"),
    ({"webhook": {"validating": {"timeoutSeconds": 60}}}, "/webhook/validating/timeoutSeconds"),
    ({"webhook": {"mutating": {"timeoutSeconds": 0}}}, "/webhook/mutating/timeoutSeconds"),
    ({"webhook": {"mutating": {"timeoutSeconds": 2.5}}}, "/webhook/mutating/timeoutSeconds"),
    ({"replicaCount": 0}, "/replicaCount"),
    ({"image": {"tag": 1.0}}, "/image/tag"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"webhook": {"kinds": {"jobs": "yes"}}}, "/webhook/kinds/jobs"),
    ({"webhook": {"kinds": {"deployments": True}}}, "/webhook/kinds"),
    ({"webhook": {"excludedNamespaces": ["Not_A_Namespace"]}}, "/webhook/excludedNamespaces/0"),
    ({"server": {"kube": "kubeconfig"}}, "/server/kube"),
    ({"server": {"kube": False}}, "/server/kube"),  # `kube: off` unquoted is YAML for false
    ({"certManager": {"enabled": "true"}}, "/certManager/enabled"),
    ({"config": {"default": {}}}, "/config"),
    ({"config": {"defaults": {"backof-limit": 3}}}, "/config/defaults"),
    ({"config": {"defaults": {"backoff-limit": -1}}}, "/config/defaults/backoff-limit"),
    ({"config": {"guardRails": {"maxBackoffLimit": "ten"}}}, "/config/guardRails/maxBackoffLimit"),
    ({"config": {"kueue": {"retryDelay": "warn"}}}, "/config/kueue/retryDelay"),
    ({"config": {"rollout": "dry-run"}}, "/config/rollout"),
    ({"config": {"namespaces": {"ml": {"rollout": "Audit"}}}}, "/config/namespaces/ml/rollout"),
    (
        {"config": {"kueue": {"waitForPodsReady": {"timeout": 600}}}},
        "/config/kueue/waitForPodsReady/timeout",
    ),
    ({"config": {"kueue": {"waitForPodsReady": {"timeout": "10 min"}}}}, "/config/kueue"),
    ({"replicas": 2}, ""),
    ({"autoscaling": {"minReplicas": 0}}, "/autoscaling/minReplicas"),
    ({"autoscaling": {"targetCPU": "0"}}, "/autoscaling/targetCPU"),
    ({"autoscaling": {"targetCPU": "70%"}}, "/autoscaling/targetCPU"),
    ({"autoscaling": {"targetCPU": 1}}, "/autoscaling/targetCPU"),
    ({"autoscaling": {"min": 1}}, "/autoscaling"),
    ({"server": {"maxConnections": 0}}, "/server/maxConnections"),
    ({"server": {"headerTimeoutSeconds": 0}}, "/server/headerTimeoutSeconds"),
    ({"server": {"headerTimeoutSeconds": 120}}, "/server/headerTimeoutSeconds"),
    ({"server": {"bodyTimeoutSeconds": 0}}, "/server/bodyTimeoutSeconds"),
    ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
    ({"networkPolicy": {"apiServer": {"cidrs": ["10.0.0.1"]}}}, "/networkPolicy/apiServer/cidrs/0"),
    (
        {"networkPolicy": {"apiServer": {"podSelector": "app=x"}}},
        "/networkPolicy/apiServer/podSelector",
    ),
    ({"networkPolicy": {"prometheus": {"namespace": "x"}}}, "/networkPolicy/prometheus"),
]


@pytest.mark.parametrize(("values", "where"), BAD_VALUES)
def test_schema_rejects_bad_values(helm, values, where):
    stderr = render_fails(helm, values)
    assert SCHEMA_ERROR in stderr
    assert f"at '{where}" in stderr


def test_schema_accepts_the_boundaries(helm):
    values = {
        "replicaCount": 1,
        "webhook": {
            "mutating": {"timeoutSeconds": 1, "failurePolicy": "Fail"},
            "validating": {"timeoutSeconds": 30, "failurePolicy": "Ignore"},
        },
        "image": {"tag": "1.0"},
    }
    docs = render(helm, values)
    assert one(docs, "Deployment")["spec"]["replicas"] == 1
    assert container(docs)["image"].endswith(":1.0")


def test_kubernetes_older_than_1_30_is_refused(helm):
    """matchConditions are GA from 1.30; an older API server would drop them silently."""
    stderr = render_fails(helm, {}, "--kube-version", "1.29.0")
    assert "requires kubeVersion: >=1.30.0-0" in stderr


def test_notes_explain_the_server_side_dry_run(helm):
    result = run_helm(helm, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--dry-run=client")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl apply --dry-run=server" in notes
    assert f"{RELEASE}-retry-policy-webhook-mutating" in notes
    assert f"{RELEASE}-retry-policy-webhook-validating" in notes
    assert "WARNING" not in notes
    result = run_helm(helm, "install", RELEASE, str(CHART), "-n", "default", "--dry-run=client")
    assert 'this release is in\n"default"' in result.stdout.split("NOTES:", 1)[1]


# --- image and docs ----------------------------------------------------------------


def test_dockerfile_is_multi_stage_non_root_with_the_cli_entrypoint():
    lines = [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    stages = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")]
    assert len(stages) >= 2
    builder, final = lines[stages[0] : stages[-1]], lines[stages[-1] :]
    assert any("pip wheel" in line for line in builder)
    assert "-slim" in final[0]
    final_text = "\n".join(final)
    for tool in ("gcc", "build-essential", "apt-get install", "pip wheel"):
        assert tool not in final_text, tool
    assert "USER 65532:65532" in final or "USER 65532" in final
    assert 'ENTRYPOINT ["retry-webhook"]' in final
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    for entry in (".venv", ".tools", "certs", ".pytest_cache", "tests"):
        assert entry in ignored, entry


def _leaf_keys(values: dict, prefix: str = "") -> list[str]:
    """Dotted value names; free-form maps (config, labels, ...) count as one value."""
    free_form = {
        "config",
        "commonLabels",
        "podAnnotations",
        "podLabels",
        "nodeSelector",
        "affinity",
        "annotations",
        "issuerRef",
        "resources",
        "podSecurityContext",
        "securityContext",
        "liveness",
        "readiness",
        "startup",
    }
    keys = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in free_form:
            keys.extend(_leaf_keys(value, name + "."))
        else:
            keys.append(name)
    return keys


def test_every_value_is_documented():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    docs = (ROOT / "docs" / "INSTALL.md").read_text()
    missing = [key for key in _leaf_keys(values) if f"`{key}`" not in docs]
    assert missing == []


def test_chart_yaml_describes_every_kind_its_webhooks_receive(helm):
    """Chart.yaml is what chart indexes show: it names each kind the webhooks take."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    described = " ".join(chart["description"].split())
    resources = {
        resource
        for d in render(helm, {})
        if d["kind"] == "MutatingWebhookConfiguration"
        for w in d["webhooks"]
        for rule in w["rules"]
        for resource in rule["resources"]
    }
    kinds = {
        "jobs": "Jobs",
        "pods": "Pods",
        "cronjobs": "CronJobs",
        "jobsets": "JobSets",
        "rayjobs": "RayJobs",
        "pytorchjobs": "PyTorchJobs",
        "trainjobs": "TrainJobs",
    }
    assert resources == set(kinds)
    assert [kinds[r] for r in sorted(resources) if kinds[r] not in described] == []
    assert {"jobset", "kuberay", "kubeflow", "trainjob"} <= set(chart["keywords"])


def test_install_md_lists_every_webhook_the_chart_renders(helm):
    docs = render(helm, {})
    rendered = {
        d["kind"]: sorted(w["name"] for w in d["webhooks"])
        for d in docs
        if d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    }
    text = (ROOT / "docs" / "INSTALL.md").read_text()
    listed = re.findall(r"^\| `([a-z-]+\.(?:mutate|validate)\.retry-policy\.dev)` \|", text, re.M)
    assert sorted(listed) == sorted(n for names in rendered.values() for n in names)
    counts = {kind: len(names) for kind, names in rendered.items()}
    assert counts == {"MutatingWebhookConfiguration": 2, "ValidatingWebhookConfiguration": 3}
    assert "The mutating configuration holds two webhooks, the validating one three" in text


# --- metrics --------------------------------------------------------------------------


def test_metrics_port_is_exposed_and_annotated(helm):
    docs = render(helm, {})
    c = container(docs)
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
    service_ports = {p["name"]: p for p in one(docs, "Service")["spec"]["ports"]}
    assert service_ports["metrics"]["port"] == 9090
    assert service_ports["metrics"]["targetPort"] == "metrics"
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9090"
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]


def test_metrics_off_removes_port_annotations_and_passes_zero(helm):
    docs = render(helm, VALUE_SETS["metrics-off"])
    c = container(docs)
    assert [p["name"] for p in c["ports"]] == ["https"]
    assert [p["name"] for p in one(docs, "Service")["spec"]["ports"]] == ["https"]
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "prometheus.io/scrape" not in annotations
    flags = dict(zip(c["args"][1::2], c["args"][2::2], strict=False))
    assert flags["--metrics-port"] == "0"


def test_metrics_service_monitor(helm):
    docs = render(helm, VALUE_SETS["service-monitor"])
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "honorLabels": True}
    ]
    service = one(docs, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_metrics_port_schema(helm):
    assert "metrics" in render_fails(helm, {"metrics": {"port": 80}})


def test_api_priority_gives_the_service_account_a_level_of_its_own(helm):
    """apiPriority.enabled: a FlowSchema for the webhook's ServiceAccount (every verb and
    resource) to a PriorityLevelConfiguration of its own, both valid for Kubernetes 1.37;
    off by default."""
    assert not objects(render(helm, {}), "FlowSchema")
    docs = render(helm, {"apiPriority": {"enabled": True}})
    level, schema = one(docs, "PriorityLevelConfiguration"), one(docs, "FlowSchema")
    assert schema["spec"]["priorityLevelConfiguration"]["name"] == level["metadata"]["name"]
    account = one(docs, "ServiceAccount", f"{RELEASE}-retry-policy-webhook")["metadata"]["name"]
    (rule,) = schema["spec"]["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": account, "namespace": NAMESPACE}}
    ]
    assert schema["spec"]["matchingPrecedence"] < 9000  # before the built-in service-accounts
    assert level["spec"]["limited"]["nominalConcurrencyShares"] == 30
    for obj in (level, schema):
        kubernetes_validate.validate(obj, "1.37", strict=True)
