"""The AdmissionReview (admission.k8s.io/v1) codec: strict decoding, exact encoding.

Decoding turns bytes into a ``Request`` or raises ``ReviewError`` with a reason the
caller answers as HTTP 400; nothing a client sends can make it raise anything else.
Encoding produces exactly what the API server accepts: the echoed ``uid``, ``patch``
only together with ``patchType: JSONPatch``, a ``status`` only on denials, and warnings
that kubectl will actually print.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import pybase64

from webhook.problems import Problem

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")

#: kubectl prints warnings on one line each; long ones may be cut by the API server.
WARNING_MAX_CHARS = 250
WARNINGS_MAX_TOTAL = 4000
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


_T = TypeVar("_T")


class ReviewError(ValueError):
    """The body is not an AdmissionReview we can answer; ``str(err)`` is the reason."""

    status = 400


@dataclass(frozen=True)
class GroupVersionKind:
    group: str
    version: str
    kind: str


@dataclass(frozen=True)
class Request:
    uid: str
    kind: GroupVersionKind
    operation: str
    namespace: str | None
    name: str | None
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    dry_run: bool = False
    sub_resource: str | None = None
    user: str | None = None
    #: The requester's groups, and the operation's options (a DELETE's DeleteOptions).
    groups: tuple[str, ...] = ()
    options: dict[str, Any] | None = None


def decode(body: bytes | str) -> Request:
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ReviewError(f"request body is not valid JSON: {err}") from None
    if not isinstance(review, dict):
        raise ReviewError("request body must be a JSON object (an AdmissionReview)")
    api_version = review.get("apiVersion")
    if api_version != API_VERSION:
        raise ReviewError(
            f"apiVersion must be {API_VERSION} (got {api_version!r}); "
            "configure the webhook with admissionReviewVersions: [v1]"
        )
    if review.get("kind") != KIND:
        raise ReviewError(f"kind must be {KIND} (got {review.get('kind')!r})")
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request must be an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid must be a non-empty string")
    gvk = request.get("kind")
    group, version, kind = (
        (gvk.get("group"), gvk.get("version"), gvk.get("kind"))
        if isinstance(gvk, dict)
        else (None, None, None)
    )
    strings = isinstance(group, str) and isinstance(version, str) and isinstance(kind, str)
    if not strings or not kind:
        raise ReviewError("request.kind must be an object with string group, version and kind")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise ReviewError(f"request.operation must be one of {', '.join(OPERATIONS)}")
    obj = _optional_object(request, "object")
    old = _optional_object(request, "oldObject")
    if operation in ("CREATE", "UPDATE") and obj is None:
        raise ReviewError(f"request.object is required for {operation}")
    namespace = _optional_str(request, "namespace")
    name = _optional_str(request, "name")
    dry_run = request.get("dryRun", False)
    if not isinstance(dry_run, bool) and dry_run is not None:
        raise ReviewError("request.dryRun must be a boolean")
    sub = _optional_str(request, "subResource")
    user_info = request.get("userInfo")
    user = user_info.get("username") if isinstance(user_info, dict) else None
    groups = user_info.get("groups") if isinstance(user_info, dict) else None
    options = request.get("options")
    return _frozen(
        Request,
        uid=uid,
        kind=_frozen(GroupVersionKind, group=group, version=version, kind=kind),
        operation=operation,
        namespace=namespace or None,
        name=name or None,
        object=obj,
        old_object=old,
        dry_run=bool(dry_run),
        sub_resource=sub or None,
        user=user if isinstance(user, str) else None,
        groups=tuple(g for g in groups if isinstance(g, str)) if isinstance(groups, list) else (),
        options=options if isinstance(options, dict) else None,
    )


def _frozen(cls: type[_T], **fields: Any) -> _T:
    """An instance of the frozen dataclass ``cls`` given every field, without its
    generated ``__init__``, which sets each field through ``object.__setattr__``: for a
    ``Request``'s twelve, most of what decoding a review costs besides parsing the JSON."""
    made = object.__new__(cls)
    made.__dict__.update(fields)
    return made


def _optional_object(request: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ReviewError(f"request.{key} must be an object or null")
    return value


def _optional_str(request: Mapping[str, Any], key: str) -> str | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ReviewError(f"request.{key} must be a string")
    return value


@dataclass
class Verdict:
    """The engine's answer, before encoding."""

    allowed: bool = True
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    message: str = ""
    code: int = 200
    reason: str = ""
    #: The problems behind a denial (for metrics by reason; never encoded as they are).
    problems: list[Problem] = field(default_factory=list)
    #: Our annotations (known keys, short names) on the object a patch was made for, for
    #: metrics by annotation; never encoded. Derived from the object, like the patch.
    annotations: tuple[str, ...] = field(default=(), compare=False)
    #: What failure-aware retries did to a pod, (action, count) sorted: containers whose
    #: memory was raised, nodes avoided (for metrics and the decision log; never encoded).
    actions: tuple[tuple[str, int], ...] = ()
    #: (reason, note) of each decision that shapes the new pod, for an Event each
    #: (``webhook.plan.outcome.Decision``; written by the server unless the request is a dry
    #: run; never encoded).
    decisions: tuple[tuple[str, str], ...] = ()
    #: A pod a disruptor deleted, for the webhook to mark disrupted
    #: (``webhook.admission.deletions``: done off the admission path unless a dry run;
    #: never encoded).
    deleted: Any = field(default=None, compare=False)
    #: What ``kubectl`` shows of the changes a person's object got (the first ``changed``
    #: of ``warnings``): one line (``engine.change_summary``) in their place, so that the
    #: warnings that say something is off stand out; "" keeps each change a warning of
    #: its own (a controller's pods: nobody reads them at apply).
    summary: str = ""
    changed: int = 0
    #: The answer already serialised (all but its uid), with the values it was made from:
    #: set by ``freeze`` on remembered verdicts, so a repeat is not encoded again.
    frozen: tuple[tuple, bytes] | None = field(default=None, repr=False, compare=False)

    def fresh(self) -> Verdict:
        """A copy whose lists a caller may change without touching this one (the patch
        is shared: it is only ever read; the serialised answer is reused while the copy
        still says the same). Copies the fields as they are, without the generated
        ``__init__``: a remembered verdict is copied on every answer it gives."""
        copy = object.__new__(type(self))
        fields = copy.__dict__
        fields.update(self.__dict__)
        fields["warnings"] = list(self.warnings)
        fields["problems"] = list(self.problems)
        return copy


def clean_warnings(warnings: list[str]) -> list[str]:
    """Printable, bounded warnings: kubectl drops ones with control characters."""
    if (
        sum(map(len, warnings)) <= WARNINGS_MAX_TOTAL
        # Printable text has no control characters; isprintable is a C loop, the regex
        # an interpreted one (a tenth of a Job's policy run). Text it refuses for other
        # reasons (e.g. a no-break space) takes the exact path below, with the same result.
        and _printable("".join(warnings))
        and max(map(len, warnings), default=0) <= WARNING_MAX_CHARS
        and list(map(str.strip, warnings)) == warnings
    ):
        return list(warnings)  # ours always are: one check instead of one per warning
    cleaned: list[str] = []
    total = 0
    for text in warnings:
        text = _CONTROL.sub(" ", text).strip()
        if len(text) > WARNING_MAX_CHARS:
            text = text[: WARNING_MAX_CHARS - 3] + "..."
        if total + len(text) > WARNINGS_MAX_TOTAL:
            cleaned.append(f"retry-policy: {len(warnings) - len(cleaned)} more warnings not shown")
            break
        cleaned.append(text)
        total += len(text)
    return cleaned


#: The printable ASCII characters (what ``str.isprintable`` accepts of ASCII).
_PRINTABLE_ASCII = bytes(range(0x20, 0x7F))


def _printable(text: str) -> bool:
    """``text.isprintable()``, a quarter of the cost for ASCII text (a warning's usual)."""
    if text.isascii():
        return not text.encode("ascii").translate(None, _PRINTABLE_ASCII)
    return text.isprintable()


def encode_bytes(uid: str, verdict: Verdict) -> bytes:
    """The response body, serialised (the server's hot path)."""
    frozen = verdict.frozen
    if frozen is not None and frozen[0] == _made_from(verdict):
        return _HEAD + orjson.dumps(uid) + b"," + frozen[1] + b"}}"
    return orjson.dumps(encode(uid, verdict))


_HEAD = orjson.dumps({"apiVersion": API_VERSION, "kind": KIND})[:-1] + b',"response":{"uid":'


def freeze(verdict: Verdict) -> Verdict:
    """Serialise ``verdict`` once for every later ``encode_bytes`` (while unchanged)."""
    serialised = orjson.dumps(_answer(verdict))
    verdict.frozen = (_made_from(verdict), serialised[1:-1])
    return verdict


def _made_from(verdict: Verdict) -> tuple:
    # The patch is compared by identity: patches are built once and only ever read.
    return (
        verdict.allowed,
        verdict.code,
        verdict.message,
        verdict.reason,
        tuple(verdict.warnings),
        verdict.summary,
        verdict.changed,
        id(verdict.patch),
    )


def encode(uid: str, verdict: Verdict) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, **_answer(verdict)}
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _answer(verdict: Verdict) -> dict[str, Any]:
    """The response's fields after ``uid``."""
    response: dict[str, Any] = {"allowed": verdict.allowed}
    if verdict.allowed and verdict.patch:
        response["patch"] = pybase64.b64encode(orjson.dumps(verdict.patch)).decode()
        response["patchType"] = "JSONPatch"
    if not verdict.allowed:
        status: dict[str, Any] = {
            "code": max(400, verdict.code),
            "message": verdict.message,
        }
        if verdict.reason:
            status["reason"] = verdict.reason
        response["status"] = status
    shown = verdict.warnings
    if verdict.summary:
        shown = [verdict.summary, *verdict.warnings[verdict.changed :]]
    warnings = clean_warnings(shown)
    if warnings:
        response["warnings"] = warnings
    return response
