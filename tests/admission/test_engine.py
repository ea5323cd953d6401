"""The AdmissionReview codec: strict decoding with reasons, exact encoding."""

from __future__ import annotations

import base64
import dataclasses
import json

import pytest

from testkit.builders import job, review
from webhook.admission import review as admission
from webhook.admission.review import ReviewError, Verdict


def test_decode_a_real_shaped_review():
    body = review(job(), uid="abc", dry_run=True)
    request = admission.decode(json.dumps(body).encode())
    assert request.uid == "abc"
    assert (request.kind.group, request.kind.version, request.kind.kind) == ("batch", "v1", "Job")
    assert request.operation == "CREATE"
    assert request.namespace == "ml"
    assert request.dry_run is True
    assert request.user == "alice"


def test_decode_sets_every_field_of_the_request():
    # decode sets the fields itself, without the dataclass's __init__ (it is on every
    # request's path): a field added to Request must be set there too.
    request = admission.decode(json.dumps(review(job())).encode())
    assert set(vars(request)) == {f.name for f in dataclasses.fields(admission.Request)}
    assert set(vars(request.kind)) == {"group", "version", "kind"}
    assert dataclasses.replace(request) == request


def base():
    return review(job())


def with_request(**changes):
    body = base()
    body["request"].update(changes)
    return body


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        ({**base(), "apiVersion": "admission.k8s.io/v1beta1"}, "admissionReviewVersions: [v1]"),
        ({**base(), "kind": "Review"}, "kind must be AdmissionReview"),
        ({k: v for k, v in base().items() if k != "request"}, "request must be an object"),
        (with_request(uid=""), "request.uid must be a non-empty string"),
        (with_request(uid=5), "request.uid must be a non-empty string"),
        (with_request(kind={"group": "batch", "version": "v1"}), "request.kind must be an object"),
        (with_request(kind="Job"), "request.kind must be an object"),
        (with_request(operation="PATCH"), "request.operation must be one of"),
        (with_request(object=None), "request.object is required for CREATE"),
        (with_request(object=[1]), "request.object must be an object or null"),
        (with_request(namespace=3), "request.namespace must be a string"),
        (with_request(dryRun="yes"), "request.dryRun must be a boolean"),
    ],
)
def test_decode_rejects_with_reason(body, reason):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ReviewError) as err:
        admission.decode(raw)
    assert reason in str(err.value)


def test_delete_may_have_no_object():
    request = admission.decode(json.dumps(with_request(operation="DELETE", object=None)))
    assert request.object is None


def test_encode_allowed_with_patch():
    patch = [{"op": "add", "path": "/metadata/annotations/a~1b", "value": "c"}]
    out = admission.encode("u1", Verdict(patch=patch, warnings=["changed"]))
    assert out["apiVersion"] == "admission.k8s.io/v1"
    assert out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == "u1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == patch
    assert response["warnings"] == ["changed"]
    assert "status" not in response


def test_encode_allowed_without_patch_has_no_patch_type():
    response = admission.encode("u1", Verdict())["response"]
    assert "patch" not in response and "patchType" not in response


def test_encode_denial():
    verdict = Verdict(allowed=False, message="no", code=200, reason="Invalid", patch=[{"op": "x"}])
    response = admission.encode("u1", verdict)["response"]
    assert response["allowed"] is False
    assert response["status"] == {"code": 400, "message": "no", "reason": "Invalid"}
    assert "patch" not in response  # a denial never carries a patch


def test_warnings_are_cleaned_and_bounded():
    warnings = ["bad\x00char\x1b[31m", "x" * 1000] + ["y" * 200] * 40
    cleaned = admission.clean_warnings(warnings)
    assert cleaned[0] == "bad char [31m"
    assert len(cleaned[1]) == admission.WARNING_MAX_CHARS and cleaned[1].endswith("...")
    assert sum(len(w) for w in cleaned) <= admission.WARNINGS_MAX_TOTAL + 100
    assert cleaned[-1].endswith("more warnings not shown")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain", "plain"),
        ("short\x07bell", "short bell"),  # a control character in a short, small list
        ("next\x85line", "next line"),  # C1 controls too
        ("caf\u00e9 \u00a0nbsp", "caf\u00e9 \u00a0nbsp"),  # not printable to Python, kept
        ("line\u2028sep", "line\u2028sep"),
    ],
)
def test_short_warnings_lose_only_control_characters(text, shown):
    assert admission.clean_warnings(["retry-policy: ok", text]) == ["retry-policy: ok", shown]


VERDICTS = [
    Verdict(),
    Verdict(patch=[{"op": "add", "path": "/spec/backoffLimit", "value": 3}], warnings=["a", "b"]),
    Verdict(warnings=["retry-policy: \x1b[31m red \x00"]),
    Verdict(allowed=False, message="retry-policy: no", code=422, reason="Invalid"),
    Verdict(allowed=False, message="m", code=200),  # a denial's code is at least 400
]


@pytest.mark.parametrize("verdict", VERDICTS)
def test_a_frozen_verdict_encodes_to_the_same_bytes(verdict):
    plain = admission.encode_bytes("uid-1", verdict)
    admission.freeze(verdict)
    assert admission.encode_bytes("uid-2", verdict) == plain.replace(b'"uid-1"', b'"uid-2"')
    assert json.loads(admission.encode_bytes('uid-"3"', verdict))["response"]["uid"] == 'uid-"3"'


def test_a_fresh_copy_says_the_same_and_shares_no_list_a_caller_may_change():
    from webhook.problems import Problem

    kept = admission.freeze(
        Verdict(
            allowed=False,
            warnings=["first"],
            message="denied",
            code=403,
            reason="Invalid",
            problems=[Problem("retry-policy.dev/backoff-limit", "must be a number")],
            annotations=("backoff-limit",),
        )
    )
    answer = admission.encode_bytes("u", kept)
    copy = kept.fresh()
    # Every field, the ones equality skips too (a field added later is carried as well).
    assert vars(copy) == vars(kept) and copy is not kept
    assert admission.encode_bytes("u", copy) == answer
    copy.warnings.append("second")
    copy.problems.clear()
    assert kept.warnings == ["first"] and len(kept.problems) == 1
    assert admission.encode_bytes("u", kept) == answer
    assert "second" in json.loads(admission.encode_bytes("u", copy))["response"]["warnings"]


def test_a_frozen_verdict_changed_afterwards_is_encoded_afresh():
    verdict = admission.freeze(Verdict(warnings=["first"]))
    verdict.warnings.append("second")
    assert json.loads(admission.encode_bytes("u", verdict))["response"]["warnings"] == [
        "first",
        "second",
    ]
    verdict.patch = [{"op": "add", "path": "/x", "value": 1}]
    assert "patch" in json.loads(admission.encode_bytes("u", verdict))["response"]
