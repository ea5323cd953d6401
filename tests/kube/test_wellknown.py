"""One home per upstream fact: the names other projects give labels, annotations and API
groups are spelled only in ``webhook/kube/wellknown.py``, and the Job controller's FailJob
message is written and read by ``webhook/kube/jobcontroller.py`` alone."""

from __future__ import annotations

import ast

import pytest

from testkit.builders import job, stored
from testkit.tools import ROOT
from webhook.kube import jobcontroller, wellknown
from webhook.kube.jobcontroller import FailJobMatch, failjob_message, parse_failjob_message

PACKAGE = ROOT / "webhook"
HOME = PACKAGE / "kube" / "wellknown.py"

#: The names, by value; a bare version ("v1alpha2") is no name, and may be another API's.
NAMES = {
    value: name
    for name, value in vars(wellknown).items()
    if name.isupper() and isinstance(value, str) and any(c in value for c in ".-/")
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of ``tree``'s module, classes and functions."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spelled(source: str) -> list[tuple[int, str]]:
    """The upstream names ``source`` spells as a string (its docstrings aside): equal to
    one, or an apiVersion of one of the groups (``"ray.io/v1"``, ``f"ray.io/{v}"``)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if id(node) in docs:
            continue
        text = node.value
        if text in NAMES:
            out.append((node.lineno, NAMES[text]))
        elif " " not in text and any(text.startswith(g + "/") for g in wellknown.GROUPS):
            out.append((node.lineno, text))
    return out


def test_the_scan_finds_a_second_spelling():
    """The scan itself: a label spelled again, an apiVersion made from a group, but not
    a docstring or a sentence that names them."""
    source = (
        '"""jobset.x-k8s.io/v1alpha2 JobSet: batch.kubernetes.io/controller-uid."""\n'
        'UID = "batch.kubernetes.io/controller-uid"\n'
        'API = f"ray.io/{version}"\n'
        'SAID = "the jobset.sigs.k8s.io/restart-attempt label as it was"\n'
    )
    assert spelled(source) == [(2, "JOB_UID_LABEL"), (3, "ray.io/")]


def test_upstream_names_are_spelled_only_in_wellknown():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != HOME
        for line, name in spelled(path.read_text())
    ]
    assert not found, "import these from webhook.kube.wellknown:\n" + "\n".join(found)


def test_each_name_is_one_fact():
    values = [v for n, v in vars(wellknown).items() if n.isupper() and isinstance(v, str)]
    assert len(values) == len(set(values))


# --- the FailJob message --------------------------------------------------------------------


def test_failjob_messages_read_back_what_they_say():
    """``matchPodFailurePolicy``'s two messages, written and read back: an exit code (an
    int32 printed with ``%v``, negative on Windows) and a pod condition."""
    exit_ = failjob_message("ml", "train-x7k2p", 1, container="trainer", code=-1073741510)
    assert parse_failjob_message(exit_) == FailJobMatch(
        "ml", "train-x7k2p", "FailJob", 1, container="trainer", exit_code=-1073741510
    )
    condition = failjob_message("ml", "train-x7k2p", 0, condition="DisruptionTarget")
    assert parse_failjob_message(condition) == FailJobMatch(
        "ml", "train-x7k2p", "FailJob", 0, condition="DisruptionTarget"
    )


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "Container main-container for pod default/mypod failed with exit code 2 matching "
            "FailJob rule at index 1",
            FailJobMatch("default", "mypod", "FailJob", 1, "main-container", 2),
        ),
        (
            "Pod default/mypod has condition DisruptionTarget matching FailJob rule at index 0",
            FailJobMatch("default", "mypod", "FailJob", 0, condition="DisruptionTarget"),
        ),
    ],
)
def test_the_job_controllers_own_messages_are_read(message, expected):
    # upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go), its
    # messages as TestMatchPodFailurePolicy (pod_failure_policy_test.go) expects them.
    assert parse_failjob_message(message) == expected
    if expected.container is not None:
        code = expected.exit_code
        again = failjob_message(
            "default", "mypod", expected.index, container=expected.container, code=code
        )
    else:
        again = failjob_message("default", "mypod", expected.index, condition=expected.condition)
    assert again == message


@pytest.mark.parametrize(
    "message",
    [
        "Job has reached the specified backoff limit",
        "Container main for pod default/p failed with exit code 2 matching FailJob rule at index",
        "prefix: Container main for pod default/p failed with exit code 2 matching FailJob "
        "rule at index 0",
    ],
)
def test_other_messages_are_not_failjob_messages(message):
    assert parse_failjob_message(message) is None


def test_the_message_as_pieces_is_the_message():
    """What JobSet's message patterns are checked against (``kinds.jobset``): the same
    text, with any field a piece of another kind."""
    fields = {"container": "main", "namespace": "ml", "pod": ["p-", ("a", "b")], "code": "42"}
    pieces = jobcontroller.failjob_pieces({**fields, "action": "FailJob", "index": "3"})
    assert pieces == [
        "Container main for pod ml/p-",
        ("a", "b"),
        " failed with exit code 42 matching FailJob rule at index 3",
    ]


# --- the pod made from a Job's template -----------------------------------------------------


#: What ``addCompletionIndexEnvVariable`` appends, as the API server hands it on (its
#: ``fieldRef`` defaulted: ``SetDefaults_ObjectFieldSelector``, pkg/apis/core/v1).
INDEX_ENV = {
    "name": wellknown.COMPLETION_INDEX_ENV,
    "valueFrom": {
        "fieldRef": {
            "apiVersion": "v1",
            "fieldPath": f"metadata.labels['{wellknown.COMPLETION_INDEX}']",
        }
    },
}


def indexed_job(name: str = "train", containers=None, init=None) -> dict:
    """A stored Indexed Job with a per-index budget, its template labelled and annotated."""
    made = stored(
        job(
            name=name,
            containers=containers,
            spec={"completionMode": "Indexed", "completions": 4, "backoffLimitPerIndex": 2},
            template_annotations={"a": "b"},
        ),
        uid="u-1",
    )
    made["spec"]["template"]["metadata"]["labels"] = {"app": "t"}
    if init is not None:
        made["spec"]["template"]["spec"]["initContainers"] = init
    return made


def test_an_indexed_jobs_pod_is_made_as_the_job_controller_makes_it():
    # upstream: GetPodFromTemplate (pkg/controller/controller_utils.go); manageJob
    # (pkg/controller/job/job_controller.go): template.Spec.Hostname; addCompletionIndexAnnotation,
    # addCompletionIndexLabel, addCompletionIndexEnvVariables, podGenerateNameWithIndex,
    # addIndexFailureCountAnnotation (pkg/controller/job/indexed_job_utils.go).
    job_ = indexed_job()
    pod_ = jobcontroller.pod_from_template(job_, 3, index_failures=1)
    meta = pod_["metadata"]
    assert "name" not in meta and "uid" not in meta
    assert "resourceVersion" not in meta and "creationTimestamp" not in meta
    assert meta["generateName"] == "train-3-"
    assert meta["labels"] == {"app": "t", wellknown.COMPLETION_INDEX: "3"}
    assert meta["annotations"] == {
        "a": "b",
        wellknown.COMPLETION_INDEX: "3",
        wellknown.INDEX_FAILURE_COUNT: "1",
    }
    assert meta["finalizers"] == [wellknown.JOB_TRACKING]
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "train",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    template = job_["spec"]["template"]["spec"]
    assert pod_["spec"]["hostname"] == "train-3"
    assert pod_["spec"]["containers"][0]["env"] == [INDEX_ENV]
    assert {k: v for k, v in pod_["spec"].items() if k not in ("hostname", "containers")} == {
        k: v for k, v in template.items() if k != "containers"
    }
    # the Job's own template is left as it was
    assert "hostname" not in template and "env" not in template["containers"][0]


def test_every_container_of_an_indexed_jobs_pod_reads_its_index_unless_it_sets_it():
    # upstream: addCompletionIndexEnvVariable (pkg/controller/job/indexed_job_utils.go): on
    # init containers and containers, appended, unless one named JOB_COMPLETION_INDEX is
    # there; the label with the PodIndexLabel gate (GA in 1.32).
    own = {"name": wellknown.COMPLETION_INDEX_ENV, "value": "7"}
    other = {"name": "MODE", "value": "fast"}
    containers = [
        {"name": "main", "image": "busybox:1.36", "env": [other]},
        {"name": "mine", "image": "busybox:1.36", "env": [own]},
    ]
    init = [{"name": "fetch", "image": "busybox:1.36"}]
    pod_ = jobcontroller.pod_from_template(indexed_job(containers=containers, init=init), 0)
    spec = pod_["spec"]
    assert spec["initContainers"][0]["env"] == [INDEX_ENV]
    assert spec["containers"][0]["env"] == [other, INDEX_ENV]
    assert spec["containers"][1]["env"] == [own]
    assert pod_["metadata"]["annotations"][wellknown.INDEX_FAILURE_COUNT] == "0"


@pytest.mark.parametrize(
    ("name", "index", "expected"),
    [
        ("indexed-job", 1, "indexed-job-1-"),
        ("x" * 55, 1, "x" * 55 + "-1-"),  # 58 exactly: kept
        ("x" * 56, 1, "x" * 55 + "-1-"),
        ("x" * 63, 12345, "x" * 51 + "-12345-"),
    ],
)
def test_a_long_job_names_pods_keep_their_index_in_their_generate_name(name, index, expected):
    # upstream: podGenerateNameWithIndex (pkg/controller/job/indexed_job_utils.go), cut to
    # names.MaxGeneratedNameLength = 63 - 5 (k8s.io/apiserver pkg/storage/names).
    pod_ = jobcontroller.pod_from_template(indexed_job(name=name), index)
    assert pod_["metadata"]["generateName"] == expected
    assert len(expected) <= jobcontroller.MAX_GENERATED_NAME_LENGTH
    assert pod_["spec"]["hostname"] == f"{name}-{index}"  # the hostname is not cut


def test_a_non_indexed_jobs_pod_has_no_index_and_keeps_the_templates_finalizers():
    # upstream: GetPodFromTemplate, getPodsPrefix (pkg/controller/controller_utils.go);
    # appendJobCompletionFinalizerIfNotFound (pkg/controller/job/job_controller.go).
    job_ = stored(job(name="train"), uid="u-1")
    job_["spec"]["template"].setdefault("metadata", {})["finalizers"] = ["example.com/keep"]
    pod_ = jobcontroller.pod_from_template(job_)
    meta = pod_["metadata"]
    assert meta["generateName"] == "train-"
    assert meta["finalizers"] == ["example.com/keep", wellknown.JOB_TRACKING]
    assert wellknown.COMPLETION_INDEX not in meta["labels"]
    assert wellknown.COMPLETION_INDEX not in meta["annotations"]
    assert "hostname" not in pod_["spec"] and "env" not in pod_["spec"]["containers"][0]
