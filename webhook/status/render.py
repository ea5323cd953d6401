"""A story as text (sections of short lines, wrapped at 80 columns whatever the terminal)
and as JSON (stable keys, documented in docs/STATUS.md)."""

from __future__ import annotations

import textwrap
from typing import Any

from webhook import explain
from webhook.explain.model import WIDTH
from webhook.kinds.story import Budget, Decision
from webhook.status import audit as audit_
from webhook.status.model import (
    Attempt,
    Category,
    JobStory,
    NextAttempt,
    Story,
)

#: The version of the JSON shape: raised only when a key changes meaning or goes away.
SCHEMA = "retry-policy.dev/status/v1"


def _fill(text: str, first: str = "  - ", rest: str | None = None) -> list[str]:
    rest = " " * len(first) if rest is None else rest
    return textwrap.wrap(
        text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


def _title(text: str) -> list[str]:
    return [*_fill(text, "", ""), "=" * min(len(text), WIDTH)]


def render_text(story: Story, plan: bool = False) -> str:
    """The story an operator came for first (state, budgets, attempts, the next attempt,
    what decided it, Events), then notes; the retry plan, long and the same for every
    run, last and only with ``plan`` (``--plan``)."""
    out = _title(f"{story.kind} {story.namespace}/{story.name}: {story.state}")
    if story.budgets:
        out += ["", "Budget:"]
        out += [line for b in story.budgets for line in _fill(f"{b.what}: {b.text}")]
    out += _next_disruption(story.next_disruption)
    if story.decision is not None:
        out += ["", *_decision(story.decision)]
    for job in story.jobs:
        out += ["", *_job(job, several=story.kind != "Job")]
    if story.older_jobs:
        out += ["", *_fill("Older Jobs (not shown): " + ", ".join(story.older_jobs), "", "")]
    out += audit_.render_text(story.audit, several=story.kind != "Job")
    out += ["", *_events(story)]
    if story.notes:
        out += ["", "Notes:"]
        out += [line for note in story.notes for line in _fill(note)]
    if story.unread:
        out += ["", "Could not read (the story above is told without it):"]
        out += [line for what in story.unread for line in _fill(what)]
    out += ["", *_plan(story, plan)]
    return "\n".join(out) + "\n"


def _plan(story: Story, shown: bool) -> list[str]:
    if not shown:
        return ["Retry plan: add --plan to see it."]
    lines = _fill(f"Retry plan, {story.explained_by}:", "", "")
    if story.explained:
        lines += ["", *explain.render_text(story.explained).rstrip("\n").split("\n")]
    return lines


def _job(job: JobStory, several: bool) -> list[str]:
    lines: list[str] = []
    if several:
        role = f" ({job.role})" if job.role else ""
        lines += [*_fill(f"Job {job.name}{role}: {job.state}", "", "  ")]
        lines += [line for b in job.budgets for line in _fill(b.text)]
    else:
        lines += ["Budget:"] + [line for b in job.budgets for line in _fill(b.text)]
        lines.append("")
    lines.append("Attempts:" if job.attempts else "Attempts: no pod of this Job exists now")
    for number, attempt in enumerate(job.attempts, 1):
        lines += _attempt(number, attempt, job)
    lines += _next_disruption(job.next_disruption)
    if job.next is not None:
        lines += _next(job.next)
    if job.decision is not None:
        lines += _decision(job.decision)
    for note in job.notes:
        lines += _fill(note)
    return lines


def _attempt(number: int, a: Attempt, job: JobStory) -> list[str]:
    where = f" on {a.node}" if a.node else ""
    index = f", index {a.index}" if a.index is not None else ""
    head = f"{a.pod}{index}: {a.phase}{where}"
    if a.phase != "Failed":
        got = _got(a.applied)
        said = f"; being disrupted ({a.disruption})" if a.disruption else ""
        said += "".join(f"; {part}" for part in _per_cause(a))
        return _fill(head + (f" ({got})" if got else "") + said, f"  {number}. ")
    head += f" at {a.finished}" if a.finished else ""
    said = "".join(f"; {part}" for part in _per_cause(a))
    lines = _fill(f"{head}; {_cause(a)}; {_counted(a)}{said}", f"  {number}. ")
    if a.category is not None:
        lines += _fill(_category(a.category), " " * (len(str(number)) + 4))
    return lines


def _category(c: Category) -> str:
    """The attempt's category, its signal and hint."""
    by = "" if c.by == "controller" else ", as status reads the pod: the controller wrote none"
    return f"{c.name} ({c.signal}{by}): {c.hint}"


def _per_cause(a: Attempt) -> list[str]:
    """What the budgets per cause say of the pod: a disruptor's deletion, its disruption's
    count, its PeerDisrupted mark, its restarts in place."""
    parts = []
    if a.deleted_by is not None:
        parts.append(f"deleted by {a.deleted_by}, a disruptor: marked a disruption by retry-policy")
    count = a.disruption_count
    if count is not None:
        limit = f"max-disruptions {count.limit}"
        if count.result == "free":
            parts.append(f"a free disruption ({limit})")
        elif count.marked:
            number = f"disruption {count.number}, " if count.number is not None else ""
            parts.append(f"{number}over {limit}: counted against the retry budget")
        elif count.result == "counted" and count.late is not None:
            head = f"over {limit}, failed before it could be marked"
            if count.late == "lowered":
                parts.append(f"{head}: counted by the controller lowering backoffLimit by one")
            elif a.counted:
                parts.append(f"{head}: counted by its rule")
            else:
                parts.append(f"{head}, and nothing could be lowered for it: not counted")
        elif count.result == "counted":  # the mark missed its window, or is still to come
            when = "not yet" if a.counted is None else "judged without the mark"
            parts.append(f"over {limit} in the controller's count, but not marked: {when}")
        else:
            parts.append(f"not counted against {limit} by the controller (yet)")
    peer = a.peer
    if peer is not None:
        whose = f"peer {peer.peer} was disrupted" if peer.peer else "a peer was disrupted"
        whose += f" ({peer.cause})" if peer.cause else ""
        setting = f"peer-disruptions {peer.setting}" if peer.setting else "peer-disruptions"
        if a.counted is None:
            how = "ignored" if peer.setting == "ignore" else "counted"
            outcome = f"its failure will be {how} ({setting})"
        elif peer.by_rule:
            outcome = f"{'counted' if a.counted else 'ignored'} ({setting})"
        else:
            outcome = f"decided by rule {a.rule + 1 if a.rule is not None else '?'} first"
        parts.append(f"{whose}: marked PeerDisrupted, {outcome}")
    in_place = a.in_place
    if in_place is not None:
        limit = f" of max-in-place-restarts {in_place.limit}" if in_place.limit is not None else ""
        used = f"{in_place.restarts} restart{'' if in_place.restarts == 1 else 's'} in place"
        if in_place.replaced:
            parts.append(f"replaced after {used}{limit}: its budget was used")
        else:
            parts.append(f"{used}{limit} used" if limit else used)
    return parts


def _next_disruption(lines: list[str]) -> list[str]:
    if not lines:
        return []
    if len(lines) == 1:
        return _fill(f"Next disruption: {lines[0]}", "", "  ")
    return ["Next disruption:", *[line for said in lines for line in _fill(said)]]


def _got(applied: dict[str, Any]) -> str:
    """What the webhook gave a running pod at its admission (its applied record)."""
    parts = []
    if isinstance(applied.get("attempt"), int):
        total = applied.get("attempts")
        parts.append(f"attempt {applied['attempt'] + 1}" + (f" of {total}" if total else ""))
    if applied.get("nonSpot") is True:
        parts.append("non-spot")
    raised = applied.get("memoryRaised")
    if isinstance(raised, dict) and raised:
        parts.append("memory raised for " + ", ".join(sorted(raised)))
    if isinstance(applied.get("avoidedNodes"), int):
        parts.append(f"keeps off {applied['avoidedNodes']} node(s)")
    return ", ".join(parts)


def _cause(a: Attempt) -> str:
    if a.disruption is not None:
        said = [a.disruption] if a.disruption else []
        said += [f"{a.container} exited {a.exit_code}"] if a.container else []
        return "disrupted" + (f" ({'; '.join(said)})" if said else "")
    if a.cause.startswith("oom-killed:"):
        return f"OOM-killed (container {a.container}, exit code {a.exit_code})"
    if a.cause.startswith("exit-code:"):
        return f"exit code {a.exit_code} in container {a.container}"
    return "failed without a container exit (a deadline, or deleted before it ran)"


def _counted(a: Attempt) -> str:
    rule = f"rule {a.rule + 1} ({a.action})" if a.rule is not None else ""
    if a.counted is False:
        return f"not counted: {rule}"
    if a.action in ("FailJob", "FailIndex"):
        return f"counted, and {rule} ends the {'Job' if a.action == 'FailJob' else 'index'}"
    return f"counted ({rule})" if rule else "counted (no rule matches)"


def _next(n: NextAttempt) -> list[str]:
    lines = [f"Next attempt: a pod Job {n.job} creates now gets"]
    if n.attempt is not None:
        of = f" of {n.attempts}" if n.attempts else ""
        place = {True: ", on non-spot nodes only", False: ", on any node", None: ""}[n.non_spot]
        lines += _fill(f"{n.unit} {n.attempt}{of}{place}")
    for m in n.memory:
        lines += _fill(f"memory {m.kind} of {m.container}: {m.before or 'none'} -> {m.after}")
    if n.avoided_nodes:
        how = "by preference" if n.avoided_by == "preference" else "required"
        lines += _fill(f"keeps off {', '.join(n.avoided_nodes)} ({how})")
    if n.delay is not None:
        held = f"pod {n.delay.pod} is held" if n.delay.pod else "it waits"
        lines += _fill(
            f"{held} until {n.delay.not_before} ({n.delay.seconds_left}s left, retry delay)"
        )
    else:
        lines += _fill("no retry delay from the webhook (the Job controller's back-off applies)")
    if n.changes:
        lines.append("  Its admission says:")
        lines += [line for c in n.changes for line in _fill(c, "    - ")]
    return lines


def _decision(d: Decision) -> list[str]:
    lines = _fill(f"Decided: {d.subject} {d.condition} ({d.reason})", "", "  ")
    if d.message:
        lines += _fill(d.message, "  ")
    if d.rule is not None:
        who = d.origin or ""
        if d.annotation:
            who += f" (annotation {d.annotation})"
        lines += _fill(f"by podFailurePolicy rule {d.rule + 1} ({d.action}): {who}", "  ")
    elif d.origin:
        who = d.origin + (f" (annotation {d.annotation})" if d.annotation else "")
        lines += _fill(who, "  ")
    return lines


def _events(story: Story) -> list[str]:
    if not story.events:
        return ["Events from retry-policy.dev/webhook: none"]
    lines = ["Events from retry-policy.dev/webhook, oldest first:"]
    for e in story.events:
        times = f" (x{e.count})" if e.count > 1 else ""
        lines += _fill(f"{e.time} {e.type} {e.reason}{times} on {e.regarding}: {e.note}")
    return lines


# --- JSON ---------------------------------------------------------------------------------


def to_json(story: Story) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "workload": {
            "apiVersion": story.api_version,
            "kind": story.kind,
            "namespace": story.namespace,
            "name": story.name,
            "uid": story.uid,
        },
        "state": story.state,
        "plan": {
            "source": story.explained_by,
            "items": explain.to_json(story.explained)["items"] if story.explained else [],
        },
        "budgets": [_budget(b) for b in story.budgets],
        "decision": _decision_json(story.decision),
        "jobs": [_job_json(j) for j in story.jobs],
        "olderJobs": list(story.older_jobs),
        "events": [
            {
                "time": e.time,
                "type": e.type,
                "reason": e.reason,
                "note": e.note,
                "count": e.count,
                "regarding": e.regarding,
            }
            for e in story.events
        ],
        "notes": list(story.notes),
        "unread": list(story.unread),
        "audit": audit_.to_json(story.audit),
    }


def _budget(b: Budget) -> dict[str, Any]:
    out = {"object": b.what, "field": b.field, "limit": b.limit, "used": b.used, "text": b.text}
    if b.disruptions is not None:
        facts = b.disruptions
        out.update(free=facts.free, counted=facts.counted, index=facts.index, next=facts.next)
    return out


def _decision_json(d: Decision | None) -> dict[str, Any] | None:
    if d is None:
        return None
    rule = None
    if d.rule is not None:
        rule = {
            "index": d.rule,
            "action": d.action,
            "origin": d.origin,
            "annotation": d.annotation,
        }
    return {
        "object": d.subject,
        "condition": d.condition,
        "reason": d.reason,
        "message": d.message,
        "time": d.time,
        "rule": rule,
        "pod": d.pod,
        "container": d.container,
        "exitCode": d.exit_code,
        "podCondition": d.pod_condition,
    }


def _job_json(j: JobStory) -> dict[str, Any]:
    return {
        "name": j.name,
        "uid": j.uid,
        "role": j.role,
        "state": j.state,
        "countedFailures": j.counted,
        "ignoredFailures": j.ignored,
        "budgets": [_budget(b) for b in j.budgets],
        "attempts": [_attempt_json(a) for a in j.attempts],
        "next": _next_json(j.next),
        "decision": _decision_json(j.decision),
        "notes": list(j.notes),
    }


def _attempt_json(a: Attempt) -> dict[str, Any]:
    return {
        "pod": a.pod,
        "phase": a.phase,
        "node": a.node,
        "created": a.created,
        "index": a.index,
        "run": a.run,
        "finished": a.finished,
        "cause": a.cause or None,
        "container": a.container,
        "exitCode": a.exit_code,
        "disruption": a.disruption,
        "counted": a.counted,
        "rule": None if a.rule is None else {"index": a.rule, "action": a.action},
        "nodeFailed": a.node_failed,
        "applied": a.applied,
        "category": None
        if a.category is None
        else {
            "name": a.category.name,
            "signal": a.category.signal,
            "hint": a.category.hint,
            "by": a.category.by,
        },
        "deletedBy": a.deleted_by,
        "disruptionBudget": None
        if a.disruption_count is None
        else {
            "result": a.disruption_count.result,
            "limit": a.disruption_count.limit,
            "number": a.disruption_count.number,
            "marked": a.disruption_count.marked,
            "late": a.disruption_count.late,
        },
        "peerDisrupted": None
        if a.peer is None
        else {
            "peer": a.peer.peer,
            "cause": a.peer.cause,
            "setting": a.peer.setting,
            "byRule": a.peer.by_rule,
        },
        "inPlace": None
        if a.in_place is None
        else {
            "restarts": a.in_place.restarts,
            "limit": a.in_place.limit,
            "replaced": a.in_place.replaced,
        },
    }


def _next_json(n: NextAttempt | None) -> dict[str, Any] | None:
    if n is None:
        return None
    return {
        "unit": n.unit,
        "attempt": n.attempt,
        "attempts": n.attempts,
        "nonSpot": n.non_spot,
        "memory": [
            {"container": m.container, "kind": m.kind, "from": m.before, "to": m.after}
            for m in n.memory
        ],
        "avoidedNodes": list(n.avoided_nodes),
        "avoidedBy": n.avoided_by,
        "delay": None
        if n.delay is None
        else {
            "pod": n.delay.pod,
            "notBefore": n.delay.not_before,
            "secondsLeft": n.delay.seconds_left,
        },
        "changes": list(n.changes),
    }
