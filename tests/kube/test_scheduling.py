"""Where a pod may run (``webhook.kube.scheduling``) and what LimitRanger refuses
(``webhook.kube.limitrange``): the upstream rules they reproduce, case by case."""

from __future__ import annotations

from fractions import Fraction

import pytest

from webhook.kube import limitrange
from webhook.kube.scheduling import Node, fits, node_of, placement

ZONE_A = Node("n1", (("disk", "ssd"), ("gen", "5"), ("zone", "a")))


def ask(node, **spec):
    return fits(node, placement(spec, ()))


def required(*terms):
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def expr(key, operator, *values):
    return {"key": key, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(
    ("requirement", "matches"),
    [
        (expr("zone", "In", "a", "b"), True),
        (expr("zone", "In", "b"), False),
        (expr("zone", "NotIn", "b"), True),
        (expr("missing", "NotIn", "b"), True),  # NotIn matches a node without the label
        ({"key": "zone", "operator": "Exists"}, True),
        ({"key": "missing", "operator": "DoesNotExist"}, True),
        ({"key": "zone", "operator": "DoesNotExist"}, False),
        (expr("gen", "Gt", "4"), True),
        (expr("gen", "Lt", "5"), False),
        (expr("zone", "Gt", "1"), False),  # not an integer label: no match
        (expr("zone", "In"), False),  # invalid (In needs values): the term matches nothing
        (expr("zone", "Exists", "a"), False),  # invalid (Exists takes none)
        (expr("zone", "Near", "a"), False),  # not an operator
    ],
)
def test_label_requirements_match_as_labels_requirement_does(requirement, matches):
    # upstream: labels.Requirement.Matches (k8s.io/apimachinery pkg/labels/selector.go)
    # via nodeSelectorRequirementsAsSelector (k8s.io/component-helpers nodeaffinity).
    assert ask(ZONE_A, affinity=required({"matchExpressions": [requirement]})) is matches


def test_terms_are_ored_requirements_anded_and_an_empty_term_matches_nothing():
    # upstream: NewLazyErrorNodeSelector skips empty terms (isEmptyNodeSelectorTerm);
    # LazyErrorNodeSelector.Match ORs the rest.
    empty = {"matchExpressions": []}
    miss = {"matchExpressions": [expr("zone", "In", "b")]}
    both = {"matchExpressions": [expr("zone", "In", "a"), expr("disk", "In", "hdd")]}
    assert not ask(ZONE_A, affinity=required(empty))
    assert not ask(ZONE_A, affinity=required(miss, both))
    assert ask(ZONE_A, affinity=required(miss, {"matchExpressions": [expr("disk", "In", "ssd")]}))


def test_match_fields_take_the_nodes_name_and_one_value():
    # upstream: nodeSelectorRequirementsAsFieldSelector (one value, In or NotIn) and
    # extractNodeFields (a node's only field is metadata.name).
    name = "metadata.name"
    assert ask(ZONE_A, affinity=required({"matchFields": [expr(name, "In", "n1")]}))
    assert not ask(ZONE_A, affinity=required({"matchFields": [expr(name, "NotIn", "n1")]}))
    assert not ask(ZONE_A, affinity=required({"matchFields": [expr(name, "In", "n1", "n2")]}))


def test_the_node_selector_needs_every_label():
    assert ask(ZONE_A, nodeSelector={"zone": "a", "disk": "ssd"})
    assert not ask(ZONE_A, nodeSelector={"zone": "a", "disk": "hdd"})


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "yes"}, True),  # no operator: Equal; no effect: any
        ({"key": "gpu", "value": "no"}, False),
        ({"key": "gpu", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # no key, Exists: every taint
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "gpu", "operator": "Gt", "value": "1"}, False),  # comparison: taken as off
    ],
)
def test_tolerations_as_toleration_tolerates_taint(toleration, tolerated):
    # upstream: Toleration.ToleratesTaint (k8s.io/api core/v1/toleration.go) and
    # FindMatchingUntoleratedTaint (k8s.io/component-helpers scheduling/corev1/helpers.go).
    node = node_of(
        {
            "metadata": {"name": "g"},
            "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    assert ask(node, tolerations=[toleration]) is tolerated


def test_only_noschedule_and_noexecute_taints_filter():
    # upstream: DoNotScheduleTaintsFilterFunc (pkg/scheduler/framework/plugins/helper).
    node = node_of(
        {
            "metadata": {"name": "p"},
            "spec": {"taints": [{"key": "busy", "effect": "PreferNoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    assert node.taints == () and ask(node)
    assert not ask(Node("x", ready=False)) and not ask(Node("x", unschedulable=True))
    assert not fits(Node("x"), placement({}, ("x",)))


def test_a_question_is_the_same_for_the_same_rules_in_any_key_order():
    a = placement({"nodeSelector": {"a": "1", "b": "2"}, "tolerations": []}, ("n",))
    b = placement({"nodeSelector": {"b": "2", "a": "1"}}, ("n",))
    assert a == b and hash(a) == hash(b)


# --- LimitRanger --------------------------------------------------------------------------


def lr(*items, name="lr"):
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {"limits": list(items)}}


def container(name, request=None, limit=None, always=False):
    resources = {}
    if request:
        resources["requests"] = {"memory": request}
    if limit:
        resources["limits"] = {"memory": limit}
    made = {"name": name, "resources": resources}
    if always:
        made["restartPolicy"] = "Always"
    return made


def test_the_tightest_bound_of_all_limitranges_holds():
    bounds = limitrange.memory_limits(
        [
            lr({"type": "Container", "max": {"memory": "8Gi"}}),
            lr({"type": "Container", "max": {"memory": "6Gi"}}, name="b"),
            lr({"type": "Pod", "maxLimitRequestRatio": {"memory": "2"}}),
            lr({"type": "PersistentVolumeClaim", "max": {"storage": "1Ti"}}),
        ]
    )
    assert bounds.container_max.text == "6Gi" and bounds.container_max.source == "ml/b"
    assert bounds.pod_ratio.value == 2 and bounds.pod_max is None


def test_pod_totals_count_sidecars_and_init_containers_as_limitranger_does():
    # upstream: podRequests / podLimits (plugin/pkg/admission/limitranger/admission.go).
    spec = {
        "initContainers": [
            container("side", "1Gi", "1Gi", always=True),
            container("setup", "3Gi", "3Gi"),
        ],
        "containers": [container("main", "1Gi", "1Gi"), container("extra", "512Mi")],
    }
    gi = Fraction(2**30)
    # requests: max(1 + 1 + 0.5, 3 + 1) = 4Gi; limits: max(1 + 1, 3 + 1) = 4Gi.
    assert limitrange.pod_total(spec, "requests") == 4 * gi
    assert limitrange.pod_total(spec, "limits") == 4 * gi
    pod_level = {**spec, "resources": {"limits": {"memory": "5Gi"}}}
    assert limitrange.pod_total(pod_level, "limits") == 5 * gi
    assert limitrange.pod_total({"containers": [container("c")]}, "limits") is None


@pytest.mark.parametrize(
    ("items", "spec", "refused"),
    [
        # maxConstraint: the limit must exist, and neither may exceed max.
        (
            [{"type": "Container", "max": {"memory": "2Gi"}}],
            {"containers": [container("c", "1Gi")]},
            {"container c: no memory limit (max 2Gi)"},
        ),
        (
            [{"type": "Container", "max": {"memory": "2Gi"}}],
            {"initContainers": [container("i", "1Gi", "3Gi")], "containers": []},
            {"container i: memory above max 2Gi"},
        ),
        # limitRequestRatioConstraint: limit <= request x ratio, both present.
        (
            [{"type": "Container", "maxLimitRequestRatio": {"memory": "2"}}],
            {"containers": [container("c", "1Gi", "3Gi")]},
            {"container c: memory ratio above 2"},
        ),
        (
            [{"type": "Pod", "max": {"memory": "3Gi"}}],
            {"containers": [container("a", "2Gi", "2Gi"), container("b", "2Gi", "2Gi")]},
            {"pod: memory above max 3Gi"},
        ),
        (
            [{"type": "Pod", "max": {"memory": "4Gi"}}],
            {"containers": [container("a", "2Gi", "2Gi")]},
            set(),
        ),
    ],
)
def test_violations_are_limitrangers_for_memory(items, spec, refused):
    # upstream: PodValidateLimitFunc (plugin/pkg/admission/limitranger/admission.go).
    assert limitrange.violations(spec, limitrange.memory_limits([lr(*items)])) == refused
