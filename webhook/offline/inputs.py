"""Manifests for the offline commands: files, directories and stdin, every object with
where it came from.

As ``kubectl -f`` reads them: a file named on the command line is read whatever its name;
a directory gives its ``.yaml``, ``.yml`` and ``.json`` files, and its subdirectories' too
with ``-R``; ``-`` is stdin. A file holds YAML documents (JSON is YAML) and a ``List`` is
read as its items. What cannot be used (a file that cannot be read, YAML that does not
parse, a document that is not a Kubernetes object) is a ``Document`` with an ``error``,
so one run reports every input problem beside every object it could check.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

STDIN = "-"
#: What a directory is searched for (kubectl's own list).
SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Source:
    """Where an object came from: its file (``-``: stdin), the YAML document (1-based;
    0: the file as a whole), the line that document starts on, and its item in a
    ``List`` (1-based)."""

    path: str
    document: int = 0
    line: int = 1
    item: int | None = None

    def __str__(self) -> str:
        if not self.document:
            return self.path
        text = f"{self.path}: document {self.document}"
        return text + (f", item {self.item}" if self.item is not None else "")


@dataclass(frozen=True)
class Document:
    """One object of the input, or (``error`` set) what could not be used, and why;
    ``node``, its YAML node, knows the line of each of its fields (``line_of``)."""

    source: Source
    obj: dict[str, Any] | None = None
    error: str = ""
    node: Any = field(default=None, compare=False, repr=False)


class UsageError(Exception):
    """Arguments that name no input at all, or stdin twice."""


def files(paths: Sequence[str], recursive: bool = False) -> Iterator[str]:
    """The files ``paths`` name, in order: a directory's in lexical order, its
    subdirectories' where they fall in it with ``recursive`` (as kubectl walks them). A
    path that does not exist is yielded as it is, for ``read`` to report."""
    if list(paths).count(STDIN) > 1:
        raise UsageError("- (stdin) can be given only once")
    for path in paths:
        if path == STDIN or not os.path.isdir(path):
            yield path
        else:
            yield from _walk(path, recursive)


def _walk(directory: str, recursive: bool) -> Iterator[str]:
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        yield directory  # unreadable: ``read`` says why
        return
    for name in names:
        full = os.path.join(directory, name)
        if os.path.isdir(full):
            if recursive and not os.path.islink(full):  # a linked directory may loop
                yield from _walk(full, recursive)
        elif name.endswith(SUFFIXES):
            yield full


def single(paths: Sequence[str]) -> bool:
    """Whether the input is one file or stdin (output then reads as it always has, without
    a file and document on every line)."""
    return len(paths) == 1 and (paths[0] == STDIN or not os.path.isdir(paths[0]))


def read_all(
    paths: Sequence[str], recursive: bool = False, stdin: TextIO | None = None
) -> list[Document]:
    """Every document of every file ``paths`` name."""
    return [doc for path in files(paths, recursive) for doc in read(path, stdin)]


def read(path: str, stdin: TextIO | None = None) -> list[Document]:
    """The objects of one file (``-``: stdin), each with its source."""
    import sys

    try:
        if path == STDIN:
            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as err:
        return [Document(Source(path), error=f"cannot read {path}: {err}")]
    try:
        parsed = _documents(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        return [Document(Source(path, 0, line), error=f"{path} is not valid YAML or JSON: {err}")]
    found: list[Document] = []
    for number, (line, node, doc) in enumerate(parsed, 1):
        if doc is None:
            continue  # an empty document: a leading ---, a file of comments
        items = list(_flatten(doc, node))
        listed = len(items) != 1 or items[0][0] is not doc
        for position, (obj, item) in enumerate(items, 1):
            at = _line(item) if listed and item is not None else line
            source = Source(path, number, at, position if listed else None)
            if not isinstance(obj, dict) or not obj.get("kind") or not obj.get("apiVersion"):
                what = f"{path}: document {number}" + (f", item {position}" if listed else "")
                found.append(
                    Document(
                        source,
                        error=f"{what} is not a Kubernetes object (needs apiVersion and kind)",
                    )
                )
            else:
                found.append(Document(source, obj, node=item))
    return found


def _documents(text: str) -> list[tuple[int, Any, Any]]:
    """Each YAML document of ``text`` with the line it starts on and its node
    (``yaml.safe_load_all``, keeping each document's node for the positions in it)."""
    loader = yaml.SafeLoader(text)
    out = []
    try:
        while loader.check_node():
            node = loader.get_node()
            line = _line(node) if node is not None else 1
            doc = loader.construct_document(node) if node is not None else None
            out.append((line, node, doc))
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]
    return out


def _flatten(doc: Any, node: Any) -> Iterator[tuple[Any, Any]]:
    """The objects of a document with their nodes: a ``List``'s items, else itself."""
    if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
        listed = _value(_step(node, "items"))
        for index, item in enumerate(doc.get("items") or []):
            yield from _flatten(item, _step(listed, index))
    else:
        yield doc, node


# --- where in its file a field of an object is -----------------------------------------

#: A problem's ``where``: an annotation (``annotation KEY``, or a template's:
#: ``spec.template annotation KEY``), else a field path (``spec.replicatedJobs[0].name``).
_ANNOTATION = re.compile(r"^(?:(?P<path>[^ ]+) )?annotation (?P<key>[^ ]+)")
_PART = re.compile(r"[^.\[\]]+|\[(\d+)\]")


def _line(node: Any) -> int:
    return int(node.start_mark.line) + 1


def _step(node: Any, part: str | int) -> Any:
    """A mapping node's value for a key, or a sequence node's item; ``None`` if absent."""
    if isinstance(part, int) and isinstance(node, yaml.SequenceNode):
        return node.value[part] if 0 <= part < len(node.value) else None
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if getattr(key, "value", None) == part:
                return _Entry(key, value)
    return None


@dataclass(frozen=True)
class _Entry:
    """A mapping's entry: its line is its key's (where a reader sees ``key: value``)."""

    key: Any
    value: Any

    @property
    def start_mark(self) -> Any:
        return self.key.start_mark


def _value(node: Any) -> Any:
    return node.value if isinstance(node, _Entry) else node


def _parts(path: str) -> list[str | int]:
    return [int(m[1]) if m[1] else m[0] for m in _PART.finditer(path)]


def line_of(doc: Document, where: str) -> int:
    """The line of what ``where`` names in the object (a problem's ``where``); the deepest
    part that exists when the rest does not (a field to add); the object's own line when
    nothing of it is there."""
    found = _ANNOTATION.match(where)
    if found:
        parts = [*_parts(found["path"] or ""), "metadata", "annotations", found["key"]]
    else:
        parts = _parts(where)
    line, node = doc.source.line, doc.node
    for part in parts:
        node = _step(_value(node), part)
        if node is None:
            break
        line = _line(node)
    return line


def line_named(doc: Document, text: str, prefix: str) -> int:
    """The line of the first of the object's ``prefix`` annotations ``text`` names (by
    its key, or by its name after the prefix, as a whole word); else the object's own."""
    obj = doc.obj or {}
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    named = []
    for key in annotations if isinstance(annotations, dict) else ():
        if isinstance(key, str) and key.startswith(prefix):
            short = re.escape(key[len(prefix) :])
            hit = re.search(rf"(?<![\w/.-])(?:{re.escape(prefix)})?{short}(?![\w-])", text)
            if hit:
                named.append((hit.start(), key))
    if not named:
        return doc.source.line
    return line_of(doc, f"annotation {min(named)[1]}")


def label(obj: dict[str, Any]) -> str:
    """``Kind/name`` (a controller's pod has only a generateName)."""
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    name = metadata.get("name") or metadata.get("generateName") or "<unnamed>"
    return f"{obj.get('kind')}/{name}"
