"""The kubelet's container restart rules (KEP-5307, KEP-5532), as it reads them: which
exit codes restart a container or its whole pod in place, the back-off before each
restart, and how many restarts a pod has made in all. What the policy writes of them is
``webhook.plan.inplace``; how explain says them, ``webhook.kinds.inplacewords``.

- The kubelet takes a container's first rule whose exit codes match, ``In`` or ``NotIn``
  (``findMatchingContainerRestartRule`` in pkg/api/v1/pod/util.go), and reads rules only
  of a container with a restartPolicy of its own. ``Restart`` restarts the container,
  ``RestartAllContainers`` the whole pod (KEP-5532: init containers run again;
  ``ShouldAllContainersRestart`` in pkg/kubelet/container/helpers.go); a rule whose
  action it does not know, or no match, falls back to that restartPolicy
  (``ContainerShouldRestart``: OnFailure restarts on a non-zero exit, Always on every
  exit). Exit code 0 is matched like any other: a ``NotIn`` rule restarts a container
  that succeeded, so it never completes, nor does its pod.
- A native sidecar (an init container with restartPolicy Always) may carry rules too:
  one whose action is RestartAllContainers restarts the pod in place; any other exit
  restarts the sidecar. Neither is a pod failure.
- With ``ContainerRestartRules`` off the API server drops the rules silently
  (``dropContainerRestartRules`` in pkg/api/pod/util.go): on by default since
  ``CONTAINER_RESTART_RULES.on_since``.
- The kubelet delays restarts with its crash-loop back-off (``doBackOff`` in
  pkg/kubelet/kuberuntime, a client-go ``flowcontrol.Backoff`` capped at
  ``MaxContainerBackOff`` in pkg/kubelet/kubelet.go): a container's first restart finds no
  back-off entry and happens at once; each later one waits 10 s, doubling, at most 300 s.
  The entry is keyed by the pod's UID and the container, so a new pod starts over, and so
  does a container that ran 10 minutes (twice the cap).
- Restarts "in all", as ``max-in-place-restarts`` counts them: the sum of the regular
  containers' ``restartCount``; for a pod whose rules restart the whole pod
  (``RestartAllContainers``), the most of one container's, as each restart of the pod
  restarts them all. Sidecars' restarts are theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.kube.failurepolicy import named_containers
from webhook.kube.objects import items, mapping
from webhook.kube.versions import CONTAINER_RESTART_RULES, KubeVersion

#: The actions that restart in place (KEP-5307, KEP-5532).
RESTART, RESTART_ALL = "Restart", "RestartAllContainers"
EXIT_CODES = range(1, 256)
#: With success, which a rule may restart too.
ALL_CODES = range(256)
#: A container's restart rules, at most (``validateContainerRestartPolicy``).
MAX_CONTAINER_RULES = 20
#: The kubelet's crash-loop back-off (see the module's doc).
BACKOFF_START_SECONDS = 10
BACKOFF_MAX_SECONDS = 300
#: Who wrote the rule that restarts a container (``Decision.origin``): its author, or
#: the webhook.
YOUR_RULE = "your rule"
OUR_RULE = "added by retry-policy"


def backoff_seconds(restart: int) -> int:
    """The kubelet's back-off after in-place restart number ``restart`` (1-based): the
    delay before the next one."""
    return min(BACKOFF_START_SECONDS * 2 ** (restart - 1), BACKOFF_MAX_SECONDS)


def restart_delay(restart: int) -> int:
    """Seconds the kubelet waits before a container's in-place restart number ``restart``
    (1-based) in one pod: none before the first (no back-off entry yet), then the
    back-off ``backoff_seconds`` gives the restarts after it."""
    return 0 if restart <= 1 else backoff_seconds(restart - 1)


@dataclass(frozen=True)
class Decision:
    """Why a container restarts in place on an exit code."""

    whole_pod: bool
    #: The matching rule (1-based) of the container's restartPolicyRules; ``None`` when
    #: its own restartPolicy restarts it.
    rule: int | None
    origin: str


@dataclass(frozen=True)
class ContainerRules:
    """One regular container's (or native sidecar's) restartPolicy and
    restartPolicyRules, and which of the rules its author wrote (``yours``, from the
    object before the webhook)."""

    name: str
    restart_policy: str | None
    rules: tuple[Any, ...]
    yours: tuple[Any, ...] = ()
    sidecar: bool = False

    def decide(self, code: int) -> Decision | None:
        """How the kubelet treats exit ``code`` (``ContainerShouldRestart``); ``None``:
        the container stays stopped."""
        if self.restart_policy is None:
            return None  # rules are read only beside a restartPolicy of the container's
        for number, rule in enumerate(self.rules, 1):
            if not matches(rule, code):
                continue
            action = mapping(rule).get("action")
            if action in (RESTART, RESTART_ALL):
                origin = YOUR_RULE if rule in self.yours else OUR_RULE
                return Decision(action == RESTART_ALL, number, origin)
            break  # an action it does not know: its restartPolicy decides
        if self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code):
            return Decision(False, None, f"its restartPolicy {self.restart_policy}")
        return None

    @property
    def restarts(self) -> bool:
        return any(self.decide(code) is not None for code in ALL_CODES)


def matches(rule: Any, code: int) -> bool:
    """``findMatchingContainerRestartRule`` for one rule: In and NotIn; other operators
    never match."""
    codes = mapping(mapping(rule).get("exitCodes"))
    values = items(codes.get("values"))
    if codes.get("operator") == "In":
        return code in values
    if codes.get("operator") == "NotIn":
        return code not in values
    return False


@dataclass(frozen=True)
class PodRestarts:
    """The restart rules of a pod template whose restartPolicy is Never."""

    containers: tuple[ContainerRules, ...]
    #: Its init containers (their exits are not the application's: see
    #: ``webhook.kinds.inplacewords.restarted``),
    #: and those of them that are native sidecars.
    init: frozenset[str] = frozenset()
    sidecars: frozenset[str] = frozenset()
    #: The native sidecars' own restart rules (those that have some).
    sidecar_rules: tuple[ContainerRules, ...] = ()

    def of(self, name: str) -> ContainerRules | None:
        found = (*self.containers, *self.sidecar_rules)
        return next((c for c in found if c.name == name), None)

    def decide_sidecar(self, name: str, code: int) -> Decision:
        """A native sidecar's exit: its rules, else its restartPolicy Always; always a
        restart (of the sidecar, or of the pod)."""
        rules = self.of(name) or ContainerRules(name, "Always", (), sidecar=True)
        return rules.decide(code) or Decision(False, None, "its restartPolicy Always")

    def decide(self, name: str, code: int) -> Decision | None:
        rules = self.of(name)
        return rules.decide(code) if rules is not None else None


def pod_restarts(
    pod_spec: Mapping[str, Any], original: Any, version: KubeVersion | None
) -> PodRestarts | None:
    """The restart rules of ``pod_spec`` (the final template; ``original`` the one the
    user wrote), or ``None`` when no container can restart in place: a pod restartPolicy
    other than Never (OnFailure restarts every failed container, and is explained as
    such), no rule, or a cluster whose API server drops the rules (``dropped``)."""
    if pod_spec.get("restartPolicy", "Always") != "Never" or dropped(pod_spec, version):
        return None
    written = {
        c["name"]: c
        for group in ("containers", "initContainers")
        for c in named_containers(mapping(original), group)
    }

    def rules_of(c: Mapping[str, Any], sidecar: bool = False) -> ContainerRules:
        return ContainerRules(
            c["name"],
            c.get("restartPolicy") if isinstance(c.get("restartPolicy"), str) else None,
            tuple(items(c.get("restartPolicyRules"))),
            tuple(items(mapping(written.get(c["name"])).get("restartPolicyRules"))),
            sidecar,
        )

    containers = tuple(rules_of(c) for c in named_containers(pod_spec, "containers"))
    init = named_containers(pod_spec, "initContainers")
    sidecars = [c for c in init if c.get("restartPolicy") == "Always"]
    with_rules = tuple(rules_of(c, True) for c in sidecars if items(c.get("restartPolicyRules")))
    if not any(c.restarts for c in containers) and not with_rules:
        return None
    return PodRestarts(
        containers,
        frozenset(c["name"] for c in init),
        frozenset(c["name"] for c in sidecars),
        with_rules,
    )


def dropped(pod_spec: Mapping[str, Any], version: KubeVersion | None) -> bool:
    """Whether the cluster's API server drops the regular containers' rules (feature gate
    off before ``CONTAINER_RESTART_RULES.on_since``)."""
    has_rules = any(
        items(c.get("restartPolicyRules"))
        for group in ("containers", "initContainers")
        for c in named_containers(pod_spec, group)
    )
    return has_rules and version is not None and version < CONTAINER_RESTART_RULES.on_since


def restarts(pod: Mapping[str, Any]) -> int:
    """The pod's restarts in place in all (see the module's doc: "in all")."""
    counts = [
        s.get("restartCount")
        for s in items(mapping(pod.get("status")).get("containerStatuses"))
        if isinstance(s, dict)
    ]
    counts = [c for c in counts if isinstance(c, int) and not isinstance(c, bool) and c >= 0]
    if not counts:
        return 0
    whole = any(
        mapping(rule).get("action") == RESTART_ALL
        for c in named_containers(mapping(pod.get("spec")), "containers")
        for rule in items(c.get("restartPolicyRules"))
    )
    return max(counts) if whole else sum(counts)
