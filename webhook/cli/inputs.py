"""What the offline commands (dry-run, explain) share: the ``-f`` inputs read as
``kubectl -f`` reads them, their options, and the Kubernetes version they are judged
against."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TextIO

from webhook.cluster.version import ASSUMED_VERSION, GivenVersion, version_for
from webhook.kube.versions import KubeVersion
from webhook.offline import inputs
from webhook.offline.inputs import Document, label
from webhook.policy.config import Config


def read_inputs(args: argparse.Namespace, stderr: TextIO) -> tuple[list[Document], bool] | None:
    """Every document the ``-f`` arguments name, and whether the output names each
    object's file (more than one file, or a directory); ``None`` after a usage error."""
    paths = [*(args.filename or []), *args.paths]
    try:
        if not paths:
            raise inputs.UsageError("no input: give files or directories, or - for stdin")
        docs = inputs.read_all(paths, args.recursive)
    except inputs.UsageError as err:
        print(f"Error: {err}", file=stderr)
        return None
    given = getattr(args, "namespace", None)
    return [_namespaced(doc, given) for doc in docs], not inputs.single(paths)


def _namespaced(doc: Document, given: str | None) -> Document:
    """``doc``, or an error in its place when it names a namespace other than ``-n``'s, as
    kubectl refuses it (an object without one takes ``-n``'s)."""
    metadata = (doc.obj or {}).get("metadata")
    own = metadata.get("namespace") if isinstance(metadata, dict) else None
    if not given or not isinstance(own, str) or not own or own == given:
        return doc
    error = (
        f"{label(doc.obj or {})}: its namespace {own!r} does not match -n {given!r}; pass "
        f"-n {own}, or leave the namespace out of the manifest"
    )
    return dataclasses.replace(doc, obj=None, error=f"{doc.source}: {error}")


def cluster_version(
    args: argparse.Namespace, config: Config, objects: list[dict[str, Any]], stderr: TextIO
) -> GivenVersion:
    """The version the offline commands judge against: ``--kubernetes-version``, else the
    config's pin, else ``ASSUMED_VERSION``, said when a policy depends on it."""
    version, assumed = version_for(args.kubernetes_version, config, objects)
    if assumed:
        print(
            f"Note: in-place restarts judged for Kubernetes {ASSUMED_VERSION}; pass "
            "--kubernetes-version X.Y for your cluster's",
            file=stderr,
        )
    return version


def prefix(doc: Document, labelled: bool) -> str:
    """What stderr lines start with: nothing for one file (as it always read), else the
    file and document, then the object."""
    obj = doc.obj or {}
    return f"{doc.source}: {label(obj)}: " if labelled else ""


def _version(text: str) -> KubeVersion:
    try:
        return KubeVersion.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None


def version_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubernetes-version",
        type=_version,
        metavar="X.Y",
        help="the cluster's Kubernetes version, for fields behind feature gates (default: "
        f"the config's kubernetesVersion, else {ASSUMED_VERSION})",
    )


def input_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        metavar="PATH",
        help="a YAML or JSON file, a directory (its .yaml, .yml and .json files), or - for "
        "stdin; repeatable",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="as -f (pre-commit's way)")
    parser.add_argument(
        "-R",
        "--recursive",
        action="store_true",
        help="read the subdirectories of the directories given with -f too",
    )
    parser.add_argument(
        "--fail-on-warn",
        action="store_true",
        help="exit 1 when the webhook would warn about an object (a setting skipped or "
        "without effect); the changes it makes are not warnings",
    )
