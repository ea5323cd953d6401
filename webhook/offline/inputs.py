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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
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
    """One object of the input, or (``error`` set) what could not be used, and why."""

    source: Source
    obj: dict[str, Any] | None = None
    error: str = ""


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
    for number, (line, doc) in enumerate(parsed, 1):
        if doc is None:
            continue  # an empty document: a leading ---, a file of comments
        items = list(_flatten(doc))
        listed = len(items) != 1 or items[0] is not doc
        for position, obj in enumerate(items, 1):
            source = Source(path, number, line, position if listed else None)
            if not isinstance(obj, dict) or not obj.get("kind") or not obj.get("apiVersion"):
                what = f"{path}: document {number}" + (f", item {position}" if listed else "")
                found.append(
                    Document(
                        source,
                        error=f"{what} is not a Kubernetes object (needs apiVersion and kind)",
                    )
                )
            else:
                found.append(Document(source, obj))
    return found


def _documents(text: str) -> list[tuple[int, Any]]:
    """Each YAML document of ``text`` with the line it starts on (``yaml.safe_load_all``,
    keeping the position of each document's node)."""
    loader = yaml.SafeLoader(text)
    out = []
    try:
        while loader.check_node():
            node = loader.get_node()
            line = node.start_mark.line + 1 if node is not None else 1
            out.append((line, loader.construct_document(node) if node is not None else None))
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]
    return out


def _flatten(doc: Any) -> Iterator[Any]:
    if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
        for item in doc.get("items") or []:
            yield from _flatten(item)
    else:
        yield doc


def label(obj: dict[str, Any]) -> str:
    """``Kind/name`` (a controller's pod has only a generateName)."""
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    name = metadata.get("name") or metadata.get("generateName") or "<unnamed>"
    return f"{obj.get('kind')}/{name}"
