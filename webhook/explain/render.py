"""Rendering explanations: text for people, JSON for pipelines."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence
from typing import Any

from webhook.explain.model import WIDTH, Denial
from webhook.plan.explained import (
    AttemptGap,
    AttemptRow,
    AttemptTable,
    Explanation,
    InPlaceTable,
    MemoryTable,
)
from webhook.plan.simulation import NextPod, Simulation, Step
from webhook.policy.grammar import format_duration

# --- rendering ---------------------------------------------------------------------------


def _fill(text: str, first: str = "", rest: str | None = None) -> list[str]:
    """Wrap to ``WIDTH``: ``first`` starts the first line, ``rest`` (default: as many
    spaces) the others."""
    rest = " " * len(first) if rest is None else rest
    return textwrap.wrap(
        text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _sentence(text: str) -> str:
    return _cap(text) if text.endswith(".") else _cap(text) + "."


def render_text(items: Sequence[Explanation | Denial]) -> str:
    """Every line fits an 80-column terminal; sections read top to bottom as a story."""
    out: list[str] = []
    for item in items:
        if out:
            out.append("")
        if isinstance(item, Denial):
            out.extend(_render_denial(item))
        else:
            out.extend(_render(item))
    return "\n".join(out) + "\n"


def _title(item: Explanation | Denial) -> str:
    name = f"{item.namespace}/{item.name}" if item.namespace else item.name
    part = f" ({item.part})" if isinstance(item, Explanation) and item.part else ""
    return f"{item.kind} {name}{part}"


def _render_denial(item: Denial) -> list[str]:
    lines = _fill(f"{_title(item)}: retry-policy would deny it; fix these and run explain again:")
    for problem in item.problems:
        lines.extend(_fill(problem, "  - "))
    return lines


def _render(item: Explanation) -> list[str]:
    title = _title(item)
    lines = [*_fill(title), "=" * min(len(title), WIDTH)]
    if item.changes:
        lines += ["", "What the webhook changes:"]
        for change in item.changes:
            lines.extend(_fill(change, "  - "))
    if item.settings:
        lines += ["", "Retry settings and where each came from:"]
        for s in item.settings:
            lines.extend(_fill(f"{s.name:<21} {s.value:<9} {s.text}", "  ", " " * 34))
    if item.audited:
        lines += ["", *_fill("Audited, not applied (rollout: audit): what the defaults say:")]
        for s in item.audited:
            lines.extend(_fill(f"{s.name:<21} {s.value:<9} {s.text}", "  ", " " * 34))
    if item.budget:
        lines += ["", *_fill(item.budget)]
    if item.rules or item.no_match:
        lines += [""]
        if item.rules:
            lines.extend(_fill(item.rules_intro))
        for rule in item.rules:
            text = f"{_cap(rule.when)}: {rule.then} ({rule.action}); {rule.origin}."
            lines.extend(_fill(text, f"  {rule.number}. "))
        if item.no_match:
            lines.extend(_fill(_sentence(item.no_match), "  -  " if item.rules else ""))
    if item.in_place is not None:
        lines += ["", *_render_in_place(item.in_place)]
    if item.examples:
        lines += ["", "What common failures do:"]
        for example in item.examples:
            lines.extend(_fill(example, "  - "))
    if item.attempts is not None:
        lines += ["", *_render_attempts(item.attempts)]
    if item.memory is not None:
        lines += ["", *_render_memory(item.memory)]
    if item.simulation is not None:
        lines += ["", *_render_simulation(item)]
    if item.notes:
        lines += ["", "Notes:"]
        for note in item.notes:
            lines.extend(_fill(note, "  - "))
    return lines


def _render_in_place(table: InPlaceTable) -> list[str]:
    lines = _fill(
        "Exit codes, container by container (its restart rules first, the first match "
        "wins; the pod fails only when none restarts the container):"
    )
    for container in table.containers:
        kind = " (native sidecar)" if container.sidecar else ""
        lines.append(f"  {container.container}{kind}:")
        for group in container.groups:
            lines.extend(_fill(group.text, "    - "))
    return [*lines, "", *_fill(_sentence(table.bound)), "", *_fill(_sentence(table.backoff))]


def _render_attempts(table: AttemptTable) -> list[str]:
    head = f"Attempt plan ({table.limit_field} {table.limit}"
    head += (
        f", last {table.non_spot_attempts} on non-spot nodes):" if table.non_spot_attempts else "):"
    )
    lines = _fill(head)
    before = "restarts so far" if table.unit == "run" else "failures so far"
    waits = f"{'waits':<8}" if table.delays else ""
    lines.append(f"  {table.unit:<9}{before:<17}{'runs on':<15}{waits}if it fails (counted)")
    for row in table.rows:
        if isinstance(row, AttemptGap):
            lines.append(
                f"  {'...':<9}({table.unit}s {row.first} to {row.last}: like the one above)"
            )
            continue
        waited = f"{row.waits:<8}" if table.delays else ""
        lines.extend(
            _fill(
                f"{row.attempt:<9}{row.failures_before:<17}{row.nodes:<15}{waited}{row.if_fails}",
                "  ",
                " " * (43 + len(waited)),
            )
        )
    if table.delays:
        lines.extend(
            _fill(
                "waits: held back after the failure before it (retry-delay); the Job "
                "controller's own back-off (10s, doubling per failure since the Job's last "
                "success, at most 10m; none after a controller-manager restart) counts from "
                "the same failure, and the longer of the two wins."
            )
        )
    return lines


def _render_memory(table: MemoryTable) -> list[str]:
    lines = _fill(
        f"Memory after OOM kills (oom-memory-factor {table.factor}, at most {table.limit}): "
        "the attempts after a container was OOM-killed N times get"
    )
    lines.append(f"  {'container':<20}{'N':<12}{'request':<12}limit")
    previous = None
    for row in table.rows:
        name = row.container if row.container != previous else ""
        previous = row.container
        kills = f"{row.kills} or more" if row.last else str(row.kills)
        lines.append(f"  {name:<20}{kills:<12}{row.request:<12}{row.limit}".rstrip())
    return lines


def _render_simulation(item: Explanation) -> list[str]:
    sim = item.simulation
    assert sim is not None
    owner = item.owner or item.kind
    lines = _fill(f"Simulation of {','.join(sim.events)}:")
    for step in sim.steps:
        lines.extend(
            _fill(f"{_step_label(sim, step)}: {step.what}. {_sentence(step.result)}", "  ", "    ")
        )
    if sim.unused:
        lines.extend(
            _fill(f"Not used (the {owner} had already ended): {','.join(sim.unused)}", "  ")
        )
    end = sim.ending
    if end.state == "Failed":
        reason = f", reason {end.reason}" if end.reason else ""
        text = f"Outcome: the {owner} fails; {sim.failed_as}{reason} ({end.message})."
    elif end.state == "IndexFailed":
        text = f"Outcome: the index fails; {end.message}."
    else:
        text = f"Outcome: the {owner} is still running; {end.message}."
    lines.extend(_fill(text))
    if sim.in_place is not None:
        lines.extend(_fill(sim.in_place.text))
    return lines


def _step_label(sim: Simulation, step: Step) -> str:
    if sim.unit == "attempt":
        return f"attempt {step.attempt}"
    if sim.unit == "exit":  # a bare Pod's containers
        return "the pod"
    wait = step.facts.delay_seconds if step.facts is not None else 0
    waited = f", after {format_duration(wait)}" if wait else ""
    if step.run is not None:
        return f"pod {step.pod} (run {step.run}, {step.nodes}{waited})"
    return f"pod {step.pod} (attempt {step.attempt}, {step.nodes}{waited})"


def to_json(items: Sequence[Explanation | Denial]) -> dict[str, Any]:
    """The same facts as the text, for tools."""
    return {"items": [_item_json(item) for item in items]}


def _item_json(item: Explanation | Denial) -> dict[str, Any]:
    base = {
        "kind": item.kind,
        "apiVersion": item.api_version,
        "namespace": item.namespace,
        "name": item.name,
    }
    if isinstance(item, Denial):
        return {**base, "allowed": False, "problems": item.problems, "changes": item.changes}
    attempts = None
    if item.attempts is not None:
        attempts = {
            "limitField": item.attempts.limit_field,
            "limit": item.attempts.limit,
            "nonSpotAttempts": item.attempts.non_spot_attempts,
            "rows": [
                _row_json(r, item.attempts.delays)
                for r in item.attempts.rows
                if isinstance(r, AttemptRow)
            ],
            "omitted": [
                {"first": r.first, "last": r.last}
                for r in item.attempts.rows
                if isinstance(r, AttemptGap)
            ],
            "unit": item.attempts.unit,
        }
    simulation = None
    if item.simulation is not None:
        sim = item.simulation
        simulation = {
            "events": sim.events,
            "steps": [_step_json(s) for s in sim.steps],
            "outcome": dataclasses.asdict(sim.ending),
            "unused": sim.unused,
            "unit": sim.unit,
            "failedAs": sim.failed_as,
            "inPlace": _camel(dataclasses.asdict(sim.in_place)) if sim.in_place else None,
            "next": _next_json(sim.next),
        }
    memory = None
    if item.memory is not None:
        memory = {
            "factor": item.memory.factor,
            "limit": item.memory.limit,
            "rows": [_camel(dataclasses.asdict(r)) for r in item.memory.rows],
        }
    return {
        **base,
        "part": item.part,
        "owner": item.owner or item.kind,
        "memory": memory,
        "allowed": True,
        "changes": item.changes,
        "settings": [dataclasses.asdict(s) for s in item.settings],
        "audited": [dataclasses.asdict(s) for s in item.audited],
        "budget": item.budget,
        "rulesIntro": item.rules_intro if item.rules else "",
        "rules": [dataclasses.asdict(r) for r in item.rules],
        "noMatch": item.no_match,
        "examples": item.examples,
        "inPlace": _in_place_json(item.in_place),
        "plan": attempts,
        "simulation": simulation,
        "notes": item.notes,
    }


def _step_json(step: Step) -> dict[str, Any]:
    data = _camel(dataclasses.asdict(step))
    data["inPlace"] = [_camel(r) for r in data["inPlace"]]
    data["facts"] = _facts_json(data["facts"])
    return data


def _row_json(row: AttemptRow, delays: bool) -> dict[str, Any]:
    """An attempt row; ``waits`` only in a table with delays."""
    data = _camel(dataclasses.asdict(row))
    if not delays:
        del data["waits"]
    return data


def _next_json(pod: NextPod | None) -> dict[str, Any] | None:
    if pod is None:
        return None
    data = _camel(dataclasses.asdict(pod))
    data["facts"] = _facts_json(data["facts"])
    return data


def _facts_json(facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """A pod's facts (``PodFacts`` as a dict), with JSON's names and lists."""
    if facts is None:
        return None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in _camel(facts).items()}


def _in_place_json(table: InPlaceTable | None) -> dict[str, Any] | None:
    if table is None:
        return None
    return {
        "containers": [
            {
                "container": c.container,
                "sidecar": c.sidecar,
                "groups": [dataclasses.asdict(g) for g in c.groups],
            }
            for c in table.containers
        ],
        "bound": table.bound,
        "bounded": table.bounded,
        "backoff": table.backoff,
    }


def _camel(data: dict[str, Any]) -> dict[str, Any]:
    def convert(key: str) -> str:
        head, *rest = key.split("_")
        return head + "".join(part.title() for part in rest)

    return {convert(k): v for k, v in data.items()}
