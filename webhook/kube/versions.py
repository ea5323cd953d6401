"""Kubernetes versions, and the releases that turned on the features the policy writes.

A field whose feature gate is off is dropped by the API server without a word (the
drop-disabled-fields functions in pkg/api/pod/util.go), so the policy writes a gated
field only for a cluster whose version has the gate on by default: a user must never
believe they have a retry behaviour the cluster silently removed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VERSION = re.compile(r"v?(?P<major>[0-9]{1,3})\.(?P<minor>[0-9]{1,3})(?:[.+\-].*)?")


@dataclass(frozen=True, order=True)
class KubeVersion:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @classmethod
    def parse(cls, text: str) -> KubeVersion:
        """``1.35``, ``v1.35.2`` or ``v1.35.2-gke.1000``; ``ValueError`` otherwise."""
        match = _VERSION.fullmatch(text.strip())
        if match is None:
            raise ValueError("accepted: a Kubernetes version such as 1.35")
        return cls(int(match["major"]), int(match["minor"]))

    @classmethod
    def of_server(cls, major: str, minor: str, git_version: str = "") -> KubeVersion:
        """From the API server's ``/version`` (``minor`` may carry a suffix: GKE's ``35+``)."""
        digits = re.match(r"[0-9]+", minor or "")
        if (major or "").isdigit() and digits:
            return cls(int(major), int(digits.group(0)))
        return cls.parse(git_version)


@dataclass(frozen=True)
class Gate:
    """A feature gate and the release where it became beta and on by default."""

    name: str
    on_since: KubeVersion
    what: str


#: KEP-5307: a container's own restartPolicy and restartPolicyRules (alpha 1.34, beta 1.35).
CONTAINER_RESTART_RULES = Gate(
    "ContainerRestartRules", KubeVersion(1, 35), "container restart rules"
)
#: KEP-5532: the rule action RestartAllContainers (alpha 1.35, beta 1.36).
RESTART_ALL_CONTAINERS = Gate(
    "RestartAllContainersOnContainerExits",
    KubeVersion(1, 36),
    "the RestartAllContainers action",
)
