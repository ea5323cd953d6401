"""The admission data path, top to bottom: request -> policy -> mutation -> patch -> verdict.

Mutation works on a deep copy and the JSON Patch is the diff between the original and
the copy (``webhook.admission.jsondiff``; never hand-written pointers), so the patch is correct by
construction: pointer escaping, parents that must exist, nothing outside what changed. Validation
runs the very same mutation and denies what it reports, so the two webhooks and the
dry-run CLI can never disagree. For Jobs and Pods the mutation runs on the object's view,
what the policy reads of it (``webhook.kinds.view``); the patch is the same, and the answer can
be remembered for every object with that view (``webhook.admission.memo``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import jsonpatch
import orjson

from webhook.admission import deletions
from webhook.admission.jsondiff import diff
from webhook.admission.memo import Memo, RecordingAttempts, fingerprint, view_key
from webhook.admission.review import Request, Verdict, freeze
from webhook.cluster import events
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.facts import ClusterFacts, NoCluster
from webhook.cluster.history import HistoryKey, HistoryLookup
from webhook.cluster.leadership import Clock, LeaderSource
from webhook.cluster.limits import LimitLookup, LimitQuestion
from webhook.cluster.nodes import NodeAnswer
from webhook.cluster.runtimes import NoRuntimes, RuntimeSource
from webhook.cluster.version import UnknownVersion, VersionSource
from webhook.kinds.base import ChecksUpdates, Restores
from webhook.kinds.registry import lookup, view_of
from webhook.kube.objects import controller_of
from webhook.kube.owned import ALL, copy_owned
from webhook.kube.scheduling import Placement
from webhook.plan.outcome import Context, Outcome
from webhook.plan.policies import has_policy_annotations, policy_keys
from webhook.policy.config import Config
from webhook.policy.model import PREFIX, Scope, Source, parse_annotations
from webhook.problems import Problem, summarize

log = logging.getLogger(__name__)

_NO_CLUSTER = NoCluster()
_NO_RUNTIMES = NoRuntimes()
_NO_VERSION = UnknownVersion()

#: Run every mutator that got a view (``webhook.kinds.view``) on the whole object too, and fail
#: the request when the answers differ: the tests' check that the views hold all a
#: mutator reads (set by the test suite; costs a second policy run, never set in service).
CHECK_VIEWS = os.environ.get("RPW_CHECK_VIEWS") == "1"


class ViewMismatch(AssertionError):
    """The mutator answered differently on the view than on the whole object."""


def change_summary(changes: int) -> str:
    """The one line ``kubectl`` shows for the changes a policy made to a person's object,
    pointing at ``explain`` (said once) and at where its CLI is."""
    plural = "s" if changes != 1 else ""
    return (
        f"retry-policy: {changes} change{plural} made: retry-webhook explain -f <manifest> "
        "shows each and the retry plan (CLI in the webhook's image)"
    )


def mutate(
    request: Request,
    config: Config,
    attempts: ClusterFacts = _NO_CLUSTER,
    runtimes: RuntimeSource = _NO_RUNTIMES,
    version: VersionSource = _NO_VERSION,
    leadership: LeaderSource | None = None,
) -> Verdict:
    """Answer the mutating webhook: a patch and one warning per change, or a denial.
    ``leadership`` tells whether a controller leads (a retry-delay gate needs one)."""
    found = _mutator_for(request, config, attempts, runtimes, version, leadership)
    if found is None:
        return _restore(request, config) if request.operation == "UPDATE" else Verdict()
    mutator, ctx, original = found
    subject = _subject(request, original, config)
    key, remembered = _recall("mutate", request, ctx, subject, mutator)
    if remembered is not None:
        return remembered
    recording = RecordingAttempts(attempts)
    ctx.cluster = recording
    ctx.clock = recording.clocked(ctx.clock)
    verdict, outcome = _apply(mutator, ctx, original, request, subject)
    if key is not None and outcome is not None:
        # Nothing else holds this verdict (its lists are the finished outcome's): kept as
        # it is, and answered with a copy, like every later request it answers.
        kept = freeze(verdict)
        MEMO.put(key, kept, recording.calls, (config, attempts))
        return kept.fresh()  # serialised once, for this answer too
    return verdict


def _mutate(
    request: Request,
    config: Config,
    attempts: ClusterFacts,
    runtimes: RuntimeSource = _NO_RUNTIMES,
    version: VersionSource = _NO_VERSION,
    leadership: LeaderSource | None = None,
) -> tuple[Verdict, Outcome | None]:
    """``mutate`` without the memo, also returning the mutator's outcome (``None`` when
    no mutator ran): ``explain`` and the dry run read what the mutator reported."""
    found = _mutator_for(request, config, attempts, runtimes, version, leadership)
    if found is None:
        return Verdict(), None
    mutator, ctx, original = found
    return _apply(mutator, ctx, original, request, _subject(request, original, config))


def _mutator_for(
    request: Request,
    config: Config,
    attempts: ClusterFacts,
    runtimes: RuntimeSource = _NO_RUNTIMES,
    version: VersionSource = _NO_VERSION,
    leadership: LeaderSource | None = None,
) -> tuple[Any, Context, dict[str, Any]] | None:
    """The mutator that must run on this request, its context and the object, if any does."""
    mutator = lookup(request.kind.group, request.kind.version, request.kind.kind)
    original = request.object
    if mutator is None or original is None or not _evaluates(mutator, request):
        return None
    ctx = _context(config, attempts, request, runtimes, version, leadership)
    return (mutator, ctx, original) if mutator.applies(original, ctx) else None


def _restore(request: Request, config: Config) -> Verdict:
    """On UPDATE of an object the policy was applied to at creation: put back what the
    update left out of it, as the kind's mutator says (``restore``: a JobSet's immutable
    failure policy, which its controller's server-side apply resets; a TrainJob's runtime
    patch, which a ``kubectl apply`` replacing the list drops). Never a new policy and
    never a denial: nothing the mutator cannot restore exactly is changed."""
    mutator = lookup(request.kind.group, request.kind.version, request.kind.kind)
    obj, old = request.object, request.old_object
    if not isinstance(mutator, Restores) or obj is None or old is None:
        return Verdict()
    restore = mutator.restore
    restored = json_copy(obj)
    ctx = Context(config, _NO_CLUSTER, _namespace(request), request.operation)
    try:
        notes = restore(restored, old, ctx)
    except Exception:
        log.exception("restore failed for %s %s", request.kind.kind, request.uid)
        return Verdict(warnings=["retry-policy: internal error; the update was not changed"])
    patch = diff(obj, restored)
    return Verdict(patch=patch, warnings=list(notes))


def _subject(request: Request, obj: dict[str, Any], config: Config) -> dict[str, Any]:
    """What the mutator runs on: the view of the object it reads (``webhook.kinds.view``), or
    the whole object for kinds without one."""
    view = view_of(request.kind.group, request.kind.version, request.kind.kind, obj, config)
    return view if view is not None else obj


def _apply(
    mutator: Any,
    ctx: Context,
    original: dict[str, Any],
    request: Request,
    subject: dict[str, Any] | None = None,
) -> tuple[Verdict, Outcome | None]:
    """Copy, mutate, diff: the policy's work for one object (run on ``subject``, the
    object's view, when given: the patch is the same, see ``webhook.kinds.view``)."""
    subject = original if subject is None else subject
    if not CHECK_VIEWS or subject is original:
        return _run(mutator, ctx, subject, request)
    recording = ctx.cluster
    if not isinstance(recording, RecordingAttempts):
        recording = ctx.cluster = RecordingAttempts(recording)
        ctx.clock = recording.clocked(ctx.clock)
    verdict, outcome = _run(mutator, ctx, subject, request)
    again = _Replay(recording, request)
    replay = dataclasses.replace(ctx, cluster=again, clock=again)
    _same_answer(request, verdict, _run(mutator, replay, original, request)[0])
    return verdict, outcome


class _Replay:
    """For the whole-object run of ``CHECK_VIEWS``: the view's run's lookups, answered
    again (the source is not asked twice); a lookup the view's run did not make fails."""

    def __init__(self, recording: RecordingAttempts, request: Request):
        self.answers = dict(recording.calls)
        self.source = recording.source
        self.request = request

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        answer = self.answers.get((namespace, name, uid))
        if answer is None:
            raise ViewMismatch(
                f"{self.request.kind.kind} {self.request.uid}: the whole object looks up "
                f"Job {namespace}/{name} ({uid}), the view did not"
            )
        return answer

    def job_history(self, key: HistoryKey) -> HistoryLookup:
        answer = self.answers.get(key)
        if answer is None:
            raise ViewMismatch(
                f"{self.request.kind.kind} {self.request.uid}: the whole object looks up "
                f"the failure history {key}, the view did not"
            )
        return answer

    def limit_ranges(self, namespace: str) -> LimitLookup:
        return self._answer(LimitQuestion(namespace))

    def placement(self, question: Placement) -> NodeAnswer:
        return self._answer(question)

    def ask(self, question: Any) -> Any:
        """A question of leadership or time (``Clock``): the view's run's answer."""
        return self._answer(question)

    def _answer(self, question: Any) -> Any:
        if question not in self.answers:
            raise ViewMismatch(
                f"{self.request.kind.kind} {self.request.uid}: the whole object asks "
                f"{question}, the view did not"
            )
        return self.answers[question]

    def stats(self) -> dict[str, Any]:
        return self.source.stats()


def _same_answer(request: Request, on_view: Verdict, on_object: Verdict) -> None:
    if on_view != on_object:
        raise ViewMismatch(
            f"{request.kind.kind} {request.uid}: the view's answer {on_view!r} differs "
            f"from the whole object's {on_object!r}"
        )


def _run(
    mutator: Any, ctx: Context, original: dict[str, Any], request: Request
) -> tuple[Verdict, Outcome | None]:
    mutated = editable(mutator, original, ctx.config)
    try:
        outcome = mutator.mutate(mutated, ctx)
    except Exception:
        log.exception("mutation failed for %s %s", request.kind.kind, request.uid)
        return Verdict(warnings=["retry-policy: internal error; no policy was applied"]), None
    if outcome.problems:
        return _deny(outcome.problems, outcome.warnings), outcome
    patch = diff(original, mutated)
    warnings = outcome.warnings if patch else outcome.notes
    summary, changed = "", 0
    if patch and outcome.changes and controller_of(original.get("metadata")) is None:
        # Only for objects a person wrote (a controller's pods have no manifest to explain),
        # and only when something changed: a no-op reinvocation stays silent.
        summary, changed = change_summary(len(outcome.changes)), len(outcome.changes)
    names = policy_keys(original.get("metadata")) if patch else ()
    actions = tuple(sorted(outcome.actions.items())) if patch else ()
    # A decision is told once, with the change it made (a no-op reinvocation stays
    # silent); a warning that nothing was done has no change to ride on.
    decisions = tuple(
        (d.reason, d.note)
        for d in outcome.decisions
        if patch or d.reason in events.WARNING_DECISIONS
    )
    verdict = Verdict(
        patch=patch,
        warnings=warnings,
        annotations=names,
        actions=actions,
        decisions=decisions,
        summary=summary,
        changed=changed,
    )
    return verdict, outcome


#: Verdicts remembered per object template (``webhook.admission.memo``): one per worker process.
MEMO = Memo()


def _recall(
    endpoint: str, request: Request, ctx: Context, subject: dict[str, Any], mutator: Any
) -> tuple[tuple | None, Verdict | None]:
    """The memo key for this request (``None``: not rememberable) and the remembered
    verdict, when there is one that still holds. The key holds the object's view when
    the mutator runs on one (its answer depends on nothing else), else the object; a
    mutator whose answer depends on other objects (a TrainJob's on its runtime) is never
    remembered (``remember = False``)."""
    if not mutator.remember:
        return None, None
    obj = request.object or {}
    shape = view_key(subject) if subject is not obj else fingerprint(obj, request.kind.kind)
    if shape is None:
        return None, None
    key = (
        endpoint,
        request.kind.group,
        request.kind.kind,
        ctx.operation,
        ctx.namespace,
        id(ctx.config),
        id(ctx.cluster),
        ctx.kubernetes_version,
        shape,
    )
    remembered = MEMO.get(key, ctx.cluster, ctx.clock)
    return key, (remembered.fresh() if remembered is not None else None)


def _context(
    config: Config,
    attempts: ClusterFacts,
    request: Request,
    runtimes: RuntimeSource,
    version: VersionSource,
    leadership: LeaderSource | None = None,
) -> Context:
    """The mutator's context; the cluster's version is the config's pin, else the API
    server's (``webhook.cluster.version``)."""
    return Context(
        config,
        attempts,
        _namespace(request),
        request.operation,
        runtimes,
        config.kubernetes_version or version.kubernetes_version(),
        clock=Clock(leadership),
    )


def validate(
    request: Request,
    config: Config,
    runtimes: RuntimeSource = _NO_RUNTIMES,
    version: VersionSource = _NO_VERSION,
) -> Verdict:
    """Answer the validating webhook: deny every problem the mutation reports, and any
    annotation-requested change that is missing (the mutating webhook did not run, or a
    later webhook undid it), so a policy a user asked for is never silently lost."""
    if request.operation == "DELETE":
        return deletions.judge(request, config)  # (always allowed)
    mutator = lookup(request.kind.group, request.kind.version, request.kind.kind)
    obj = request.object
    if mutator is None or obj is None:
        return Verdict()
    if not _evaluates(mutator, request):
        if request.operation == "UPDATE":
            return _validate_update(request, obj, mutator)
        return Verdict()
    ctx = _context(config, _NO_CLUSTER, request, runtimes, version)
    if not mutator.applies(obj, ctx):
        return Verdict()
    subject = _subject(request, obj, config)
    key, remembered = _recall("validate", request, ctx, subject, mutator)
    if remembered is not None:
        return remembered
    verdict, complete = _validate(mutator, subject, ctx, request)
    if CHECK_VIEWS and subject is not obj:
        _same_answer(request, verdict, _validate(mutator, obj, ctx, request)[0])
    if key is not None and complete:
        kept = freeze(verdict)
        MEMO.put(key, kept, [], (config,))
        return kept.fresh()
    return verdict


def _validate(
    mutator: Any, obj: dict[str, Any], ctx: Context, request: Request
) -> tuple[Verdict, bool]:
    """The validating verdict, and whether the policy ran to completion (the answer to
    an internal error is not remembered)."""
    try:
        outcome = mutator.mutate(editable(mutator, obj, ctx.config), ctx)
    except Exception:
        log.exception("validation failed for %s %s", request.kind.kind, request.uid)
        if has_policy_annotations(obj.get("metadata")):
            problem = Problem("retry-policy", "internal error evaluating the policy")
            return _deny([problem], []), False
        return Verdict(), False
    problems = list(outcome.problems)
    if mutator.enforce_applied:
        problems.extend(_unapplied(outcome))
    if problems:
        return _deny(problems, []), True
    return Verdict(), True


def editable(mutator: Any, obj: dict[str, Any], config: Config | None = None) -> dict[str, Any]:
    """The copy a mutator edits: new where it declared it may write (``owns``, see
    ``webhook.kube.owned``, or what its ``owned`` says of this object under ``config``),
    shared elsewhere; a full copy for a mutator that declares nothing."""
    owned = getattr(mutator, "owned", None) if config is not None else None
    owns = owned(obj, config) if owned is not None else mutator.owns
    return json_copy(obj) if owns is ALL else copy_owned(obj, owns)


def json_copy(obj: Any) -> Any:
    """A deep copy of a JSON document: a round trip through orjson (C), far cheaper than
    ``copy.deepcopy`` (admission's hot path: ``kube.owned.deep_copy`` elsewhere)."""
    return orjson.loads(orjson.dumps(obj))


def _evaluates(mutator: Any, request: Request) -> bool:
    """Whether the full policy runs: on CREATE; on UPDATE only for kinds that are templates
    of objects created later (a CronJob's jobTemplate, listed in the mutator's
    ``reevaluate_on_update``), and only when that template or our annotations changed, so
    an unrelated update (suspend, labels) is never blocked by rules added later."""
    if request.operation == "CREATE":
        return True
    paths = mutator.reevaluate_on_update
    if request.operation != "UPDATE" or not paths or request.object is None:
        return False
    old = request.old_object or {}
    return _our_annotations(request.object) != _our_annotations(old) or any(
        _at(request.object, path) != _at(old, path) for path in paths
    )


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _unapplied(outcome: Outcome) -> list[Problem]:
    return [
        Problem(
            "retry-policy",
            f"the policy you annotated was not applied "
            f"({change.text.removeprefix('retry-policy: ')}); "
            "is the mutating webhook installed and reachable?",
            "not-applied",
        )
        for change in outcome.changes
        if change.setting is not None and change.setting.source is Source.ANNOTATION
    ]


def _validate_update(request: Request, obj: Mapping[str, Any], mutator: Any) -> Verdict:
    """On UPDATE the policy is not applied again (``podFailurePolicy`` and a Job's pod
    template are immutable). Changed annotations are checked, and said to come too late
    for this object; a changed retry budget (mutable: a Job's ``backoffLimit``, a RayJob's,
    a PyTorchJob's) must still agree with the object's annotations
    (``mutator.check_update``)."""
    old_obj = request.old_object or {}
    problems, warnings, current = (
        mutator.check_update(obj, old_obj)
        if isinstance(mutator, ChecksUpdates)
        else ([], [], set())
    )
    new, old = _our_annotations(obj), _our_annotations(old_obj)
    if new != old:
        scope = Scope.POD if request.kind.kind == "Pod" else Scope.WORKLOAD
        _, parsed = parse_annotations(new, scope)
        problems = [*parsed, *problems]
        changed = {k for k in new.keys() | old.keys() if new.get(k) != old.get(k)}
        if changed - {PREFIX + name for name in current}:
            warnings.append(
                f"retry-policy: {request.kind.kind} already exists; changed retry-policy "
                "annotations apply to objects created from now on, not to this one"
            )
    if problems:
        return _deny(problems, [])
    return Verdict(warnings=warnings)


def _our_annotations(obj: Mapping[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata") or {}
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return {}
    return {k: v for k, v in annotations.items() if isinstance(k, str) and k.startswith(PREFIX)}


def _namespace(request: Request) -> str | None:
    if request.namespace:
        return request.namespace
    metadata = (request.object or {}).get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("namespace"), str):
        return metadata["namespace"]
    return None


def _deny(problems: list[Problem], warnings: list[str]) -> Verdict:
    # Once each: a JobSet's replicated Jobs, say, each find the same problem of the policy.
    problems = list(dict.fromkeys(problems))
    guard_rail_only = all(p.reason == "guard-rail" for p in problems)
    return Verdict(
        allowed=False,
        message="retry-policy: " + summarize(problems),
        code=403 if guard_rail_only else 422,
        reason="Forbidden" if guard_rail_only else "Invalid",
        warnings=warnings,
        problems=list(problems),
    )


@dataclasses.dataclass
class Review:
    """One object reviewed as the API server would (mutate, then validate the result)."""

    verdict: Verdict
    #: The object as it would be stored (the input, unchanged, when denied).
    result: dict[str, Any]
    #: What the mutator reported (problems, changes, resolved policies); ``None`` when no
    #: mutator ran (a kind we do not manage, or nothing for the policy to do).
    outcome: Outcome | None = None


def review(
    obj: dict[str, Any],
    config: Config,
    namespace: str | None = None,
    attempts: ClusterFacts = _NO_CLUSTER,
    runtimes: RuntimeSource = _NO_RUNTIMES,
    version: VersionSource = _NO_VERSION,
) -> Review:
    """Mutate then validate one object as the API server would; for the CLI (dry-run, explain)."""
    from webhook.admission.review import GroupVersionKind

    api_version = str(obj.get("apiVersion") or "")
    group, _, served = api_version.rpartition("/")
    metadata: Any = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    request = Request(
        uid="dry-run",
        kind=GroupVersionKind(group, served, str(obj.get("kind") or "")),
        operation="CREATE",
        namespace=namespace or metadata.get("namespace"),
        name=metadata.get("name"),
        object=obj,
        old_object=None,
        dry_run=True,
    )
    mutated_verdict, outcome = _mutate(request, config, attempts, runtimes, version)
    if not mutated_verdict.allowed:
        return Review(mutated_verdict, obj, outcome)
    result = jsonpatch.apply_patch(obj, mutated_verdict.patch) if mutated_verdict.patch else obj
    second = validate(dataclasses.replace(request, object=result), config, runtimes, version)
    if not second.allowed:
        second = dataclasses.replace(second, warnings=mutated_verdict.warnings)
        return Review(second, obj, outcome)
    return Review(mutated_verdict, result, outcome)


def review_object(
    obj: dict[str, Any],
    config: Config,
    namespace: str | None = None,
    attempts: ClusterFacts = _NO_CLUSTER,
    runtimes: RuntimeSource = _NO_RUNTIMES,
    version: VersionSource = _NO_VERSION,
) -> tuple[Verdict, dict[str, Any]]:
    """``review`` as a pair: the combined verdict and the resulting object."""
    reviewed = review(obj, config, namespace, attempts, runtimes, version)
    return reviewed.verdict, reviewed.result
