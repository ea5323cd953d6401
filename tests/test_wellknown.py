"""One home per upstream fact: the names other projects give labels, annotations and API
groups are spelled only in ``webhook/kube/wellknown.py``, and the Job controller's FailJob
message is written and read by ``webhook/kube/jobcontroller.py`` alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from webhook.kube import jobcontroller, wellknown
from webhook.kube.jobcontroller import FailJobMatch, failjob_message, parse_failjob_message

ROOT = Path(__file__).resolve().parent.parent
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


def test_an_indexed_jobs_pod_is_made_as_the_job_controller_makes_it():
    # upstream: GetPodFromTemplate (pkg/controller/controller_utils.go);
    # addCompletionIndexAnnotation, addCompletionIndexLabel, podGenerateNameWithIndex,
    # addIndexFailureCountAnnotation (pkg/controller/job/indexed_job_utils.go).
    job = {
        "metadata": {"name": "train", "namespace": "ml", "uid": "u-1"},
        "spec": {
            "completionMode": "Indexed",
            "backoffLimitPerIndex": 2,
            "template": {
                "metadata": {"labels": {"app": "t"}, "annotations": {"a": "b"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main"}]},
            },
        },
    }
    pod = jobcontroller.pod_from_template(job, 3, index_failures=1)
    meta = pod["metadata"]
    assert "name" not in meta and "uid" not in meta
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
    assert pod["spec"] == job["spec"]["template"]["spec"]
    assert pod["spec"] is not job["spec"]["template"]["spec"]
