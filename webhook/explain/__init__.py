"""``retry-webhook explain``: a workload's retry plan, in plain words, before it runs.

Retry behaviour is opaque from the outside: which failures consume the budget, which end
the workload at once, where each attempt runs. This module answers those questions for
the object the webhook would store, so the answer cannot drift from what happens:

- the object goes through the same engine as admission (``engine.review``: mutate, then
  validate), and the mutator's resolved policy (``Outcome.policies``) supplies the
  provenance of every setting;
- failures are judged by the one podFailurePolicy evaluation (``failurepolicy.evaluate``)
  that validation and the attempt cache use;
- placement follows the pod webhook's rule: attempt ``a`` (counted failures so far) runs
  on non-spot nodes when ``a >= B + 1 - N``.

Each kind's explainer is in its folder (``kinds/<kind>/explain.py``), named by its
``KindSpec`` (``KindSpec.explainer``): one function that turns a reviewed object into
``Explanation`` values; ``kinds.explaining.explain_job_spec`` explains any batch/v1
JobSpec (a Job's, a CronJob's job template, a JobSet's replicated Job), so most kinds
are a one-line call to it. Rendering (``render_text``, ``to_json``) is shared by all kinds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.admission import engine
from webhook.cluster.runtimes import NoRuntimes, RuntimeSource
from webhook.cluster.version import GivenVersion, UnknownVersion, VersionSource
from webhook.explain.model import Denial
from webhook.explain.render import render_text, to_json
from webhook.kinds.base import KindSpec
from webhook.kinds.job.simulate import failjob_message
from webhook.kinds.registry import KINDS, known_kind
from webhook.kube.objects import controller_of, mapping
from webhook.plan.audit import AuditRecord, by_words
from webhook.plan.explained import Explainer, Explanation, SettingLine, Subject
from webhook.plan.outcome import Context, Outcome
from webhook.plan.simulation import ACCEPTED_EVENTS, Event, ExplainError, parse_events
from webhook.policy.config import Config

__all__ = [
    "Denial",
    "ExplainError",
    "Explanation",
    "explain",
    "explain_stored",
    "explained_kinds",
    "failjob_message",
    "parse_events",
    "render_text",
    "to_json",
]


# --- entry point -----------------------------------------------------------------------


def explain(
    obj: dict[str, Any],
    config: Config,
    namespace: str | None = None,
    events: Sequence[Event] | None = None,
    runtimes: RuntimeSource | None = None,
    version: VersionSource | None = None,
) -> list[Explanation] | Denial | None:
    """Review ``obj`` as admission would and explain the result.

    ``obj`` must be prepared as the API server would see it (defaults applied, intent
    recorded: ``cli.prepare``). Returns a ``Denial`` when the webhook would deny it,
    ``None`` for a kind explain does not cover, else one ``Explanation`` per part.
    ``runtimes`` are the Kubeflow Trainer runtimes a TrainJob may name (given in the same
    input). Raises ``ExplainError`` when an event names a container the workload does not
    have.
    """
    group = str(obj.get("apiVersion") or "").rpartition("/")[0]
    kind = str(obj.get("kind") or "")
    for part in ("metadata", "spec"):
        if not isinstance(obj.get(part) or {}, dict):
            raise ExplainError(f"{kind or 'object'}: {part} must be a mapping of fields")
    runtimes = runtimes if runtimes is not None else NoRuntimes()
    version = version if version is not None else UnknownVersion()
    reviewed = engine.review(obj, config, namespace, runtimes=runtimes, version=version)
    changes = [w.removeprefix("retry-policy: ") for w in reviewed.verdict.warnings]
    metadata = mapping(obj.get("metadata"))
    if not reviewed.verdict.allowed:
        problems = [str(p) for p in (reviewed.outcome.problems if reviewed.outcome else [])]
        return Denial(
            kind,
            str(obj.get("apiVersion")),
            str(metadata.get("namespace") or ""),
            str(metadata.get("name") or metadata.get("generateName") or "<unnamed>"),
            problems or [reviewed.verdict.message.removeprefix("retry-policy: ")],
            changes,
        )
    function = _explainer(known_kind(group, kind))
    if function is None:
        return None
    ns = namespace or metadata.get("namespace")
    ctx = Context(
        config,
        namespace=ns,
        runtimes=runtimes,
        kubernetes_version=config.kubernetes_version or version.kubernetes_version(),
    )
    subject = Subject(obj, reviewed.result, reviewed.outcome, ctx, changes, _admit)
    explanations = function(subject)
    if explanations and reviewed.outcome is not None and reviewed.outcome.audited is not None:
        explanations[0].audited = audited_lines(reviewed.outcome.audited, ns)
    _managed_note(explanations, metadata, kind, config, ns)
    if events is not None:
        simulated = [item for item in explanations if item.simulator is not None]
        placed = _place_events(simulated, events)
        for item in explanations:
            if item.simulator is None:
                item.notes.append(
                    item.simulate_note
                    or f"--simulate does not apply to a {item.kind}: Kubernetes does not "
                    "retry it; simulate the workload that creates it"
                )
                continue
            mine = [(position, event) for position, event, parts in placed if item in parts]
            if not mine:
                item.notes.append(
                    "--simulate: no event names a container of this part's pods, so none "
                    "was walked through it"
                )
                continue
            _check_containers(item, mine)
            _check_successes(item, mine)
            item.simulation = item.simulator.run([event for _, event in mine])
    return explanations


def explain_stored(
    original: Mapping[str, Any],
    stored: Mapping[str, Any],
    outcome: Outcome,
    config: Config,
    namespace: str | None = None,
) -> list[Explanation] | None:
    """Explain an object as the webhook stored it, without admitting it again (``retry-
    webhook status``): ``stored`` is what the webhook wrote, ``original`` the same without
    what the webhook added (its rules, as its applied record says: those are then told
    as the webhook's), and ``outcome`` carries what is known of the admission (the rules
    and, where given, the policies; an explainer resolves a missing policy from the
    annotations and ``config`` as the mutator would). ``None`` for a kind explain does
    not cover."""
    group = str(stored.get("apiVersion") or "").rpartition("/")[0]
    kind = str(stored.get("kind") or "")
    function = _explainer(known_kind(group, kind))
    if function is None:
        return None
    metadata = mapping(stored.get("metadata"))
    ns = namespace or metadata.get("namespace")
    ctx = Context(config, namespace=ns, kubernetes_version=config.kubernetes_version)
    explanations = function(Subject(original, stored, outcome, ctx, [], _admit))
    audited = AuditRecord.of(stored)
    if explanations and audited is not None:
        explanations[0].audited = audited_lines(audited, ns)
    _managed_note(explanations, metadata, kind, config, ns)
    return explanations


def explained_kinds() -> list[tuple[str, str]]:
    """The kinds explain covers, by (group, kind): those whose ``KindSpec`` names an
    explainer (each loaded, so that a wrong name fails here)."""
    return sorted((s.group, s.kind) for s in KINDS if _explainer(s) is not None)


def _explainer(spec: KindSpec | None) -> Explainer | None:
    """The kind's explainer, at whatever version it is given (``None``: not covered)."""
    return spec.explainer.load() if spec is not None and spec.explainer is not None else None


def _admit(obj: dict[str, Any], ctx: Context) -> tuple[Mapping[str, Any], Outcome | None]:
    """Admission of an object an explainer makes on the way (``Subject.admit``: a
    TrainJob's JobSet), at the context's Kubernetes version."""
    version = ctx.kubernetes_version
    reviewed = engine.review(
        obj,
        ctx.config,
        ctx.namespace,
        runtimes=ctx.runtimes,
        version=GivenVersion(version) if version is not None else UnknownVersion(),
    )
    return reviewed.result, reviewed.outcome


def _managed_note(
    explanations: list[Explanation], metadata: Any, kind: str, config: Config, ns: Any
) -> None:
    owner = controller_of(metadata)
    if owner is not None and explanations and config.affects_unannotated(ns):
        explanations[0].notes.append(
            f"this {kind} is managed by {owner.get('kind')} {owner.get('name')}: the "
            "cluster's defaults and guard rails do not apply to it (its controller chose "
            "its retry behaviour); only annotations on the object itself do"
        )


def audited_lines(record: AuditRecord, namespace: str | None) -> list[SettingLine]:
    """The settings audit held back, as the record says them (``webhook.kinds.audit``)."""
    lines = []
    for name, value in record.settings.items():
        by = record.by.get(name, "")
        detail = f"({namespace})" if by == "namespace" and namespace else ""
        source = by_words(by)
        text = f"{source} {detail}".strip() + ": audited, not applied"
        lines.append(SettingLine(name, value, source, detail, text))
    return lines


def _check_successes(item: Explanation, events: Sequence[tuple[int, Event]]) -> None:
    """Exit code 0 is a success: an event of only zeros is something to simulate only
    where a restart rule restarts on it (``kinds.inplacewords.restarted`` decides which);
    with no container restarting in place, none does (events by their position)."""
    if item.in_place is not None or item.simulator is None:
        return
    main = next(iter(item.simulator.containers), "main")
    for position, event in events:
        if event.succeeded(main):
            raise ExplainError(
                f"--simulate: event {position} {event.token!r}: exit code 0 is success, and "
                "no container restarts in place on it: the pod does not fail; " + ACCEPTED_EVENTS
            )


def _label(item: Explanation) -> str:
    return f"{item.kind}/{item.name}" + (f" ({item.part})" if item.part else "")


def _place_events(
    parts: Sequence[Explanation], events: Sequence[Event]
) -> list[tuple[int, Event, list[Explanation]]]:
    """Each event with the parts whose pods it can fail: those with every container it
    names (an event naming none is the main container's, in every part). A workload of
    several kinds of pods (a JobSet's replicated Jobs: a TrainJob's initializers and its
    trainer) takes an event in the part its container is in."""
    placed: list[tuple[int, Event, list[Explanation]]] = []
    if not parts:
        return placed
    for position, event in enumerate(events, 1):
        named = event.named()
        fits = [
            item
            for item in parts
            if item.simulator is not None and all(n in item.simulator.containers for n in named)
        ]
        if not fits and len(parts) == 1:
            _check_containers(parts[0], [(position, event)])
        if not fits:
            known = sorted(
                {c for item in parts if item.simulator for c in item.simulator.containers}
            )
            where = f"--simulate: event {position} {event.token!r}"
            missing = [n for n in named if n not in known]
            what = (
                f"names container {missing[0]!r}, which no pod of "
                f"{parts[0].kind}/{parts[0].name} has"
                if missing
                else "names containers of different pods"
            )
            raise ExplainError(f"{where} {what}; its containers: " + ", ".join(known))
        placed.append((position, event, fits))
    return placed


def _check_containers(item: Explanation, events: Sequence[tuple[int, Event]]) -> None:
    """Every container an event names is one of ``item``'s; a bare exit code is its main
    container's, which the event must not also name (events by their position)."""
    known = list(item.simulator.containers) if item.simulator else []
    label = _label(item)
    for position, event in events:
        where = f"--simulate: event {position} {event.token!r}"
        for name in event.named():
            if name not in known:
                raise ExplainError(
                    f"{where} names container {name!r}, which {label} does not have; "
                    "its containers: " + ", ".join(known)
                )
        main = known[0] if known else "main"
        if not event.implied and event.container is None and main in event.named():
            raise ExplainError(
                f"{where} gives container {main} (the main one, which a bare exit code "
                f"means) two exit codes; {ACCEPTED_EVENTS}"
            )
