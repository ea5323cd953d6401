"""What ``retry-webhook dry-run`` reports of each object: its ``reports.Result`` (JUnit
XML, SARIF), each problem and warning at the line of its file it is about, the object's
``kubectl -o name``, and the line that sums up a run over many files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from webhook.offline import inputs, reports
from webhook.offline.inputs import Document, label
from webhook.policy.model import PREFIX

#: The rule ids of dry-run's reports, and what each means.
RULES = {
    "denied": "The webhook would deny the object",
    "warning": "The webhook would admit the object with warnings",
    "admitted": "The webhook would admit the object",
    "input": "The input could not be read as Kubernetes objects",
}


def name_of(doc: Document) -> str:
    """A report's name for one object: ``Job/train (document 2)``."""
    source = doc.source
    if doc.obj is None:
        return f"document {source.document}" if source.document else "the file"
    where = f"document {source.document}" + (
        f", item {source.item}" if source.item is not None else ""
    )
    return f"{label(doc.obj)} ({where})"


def properties(doc: Document) -> dict[str, Any]:
    obj = doc.obj or {}
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    found = {
        "document": doc.source.document,
        "item": doc.source.item,
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "namespace": metadata.get("namespace"),
        "name": metadata.get("name") or metadata.get("generateName"),
    }
    return {k: v for k, v in found.items() if v is not None}


def input_result(doc: Document) -> reports.Result:
    return reports.Result(
        doc.source.path,
        name_of(doc),
        reports.ERROR,
        "input",
        doc.error,
        line=doc.source.line,
        level="error",
        properties=properties(doc),
    )


def dry_run_result(doc: Document, checked: Any, fail_on_warn: bool) -> reports.Result:
    """One object's line in the reports: denied, warned (a failure with
    ``--fail-on-warn``), or admitted with the changes the webhook makes."""
    verdict = checked.verdict
    common: dict[str, Any] = {
        "line": doc.source.line,
        "properties": properties(doc),
        "output": tuple(verdict.warnings),
    }
    name = name_of(doc)
    if not verdict.allowed:
        # Each problem at the line it is about: the annotation (or field) it names.
        found = tuple(
            reports.Finding(f"retry-policy: {p}", inputs.line_of(doc, p.where))
            for p in verdict.problems
        )
        return reports.Result(
            doc.source.path,
            name,
            reports.FAILED,
            "denied",
            verdict.message,
            level="error",
            findings=found,
            **common,
        )
    if checked.warnings:
        status = reports.FAILED if fail_on_warn else reports.PASSED
        text = "; ".join(checked.warnings)
        found = tuple(
            reports.Finding(w, inputs.line_named(doc, w, PREFIX)) for w in checked.warnings
        )
        return reports.Result(
            doc.source.path,
            name,
            status,
            "warning",
            text,
            level="warning",
            findings=found,
            **common,
        )
    changes = len(checked.changes)
    text = f"admitted; the webhook makes {changes} change(s)" if changes else "admitted unchanged"
    return reports.Result(doc.source.path, name, reports.PASSED, "admitted", text, **common)


def kubectl_name(obj: dict[str, Any]) -> str:
    """``kubectl -o name``'s form: ``job.batch/train``, ``pod/x``."""
    group = str(obj.get("apiVersion") or "").rpartition("/")[0]
    kind = str(obj.get("kind") or "").lower()
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    name = metadata.get("name") or metadata.get("generateName") or ""
    return f"{kind}.{group}/{name}" if group else f"{kind}/{name}"


def summary(docs: Sequence[Document], found: Sequence[reports.Result]) -> str:
    """The last line on stderr when many files were read."""
    files = len({d.source.path for d in docs})
    objects = sum(d.obj is not None for d in docs)
    counts = {
        "admitted": sum(r.rule in ("admitted", "warning") for r in found),
        "denied": sum(r.rule == "denied" for r in found),
        "with warnings": sum(r.rule == "warning" for r in found),
        "input errors": sum(r.rule == "input" for r in found),
    }
    said = ", ".join(f"{n} {what}" for what, n in counts.items() if n or what == "admitted")
    return f"Checked {objects} object(s) in {files} file(s): {said}"
