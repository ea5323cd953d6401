"""A JobSet's ``failurePolicy`` as the JobSet controller carries it out when a child Job
fails (kubernetes-sigs/jobset pkg/controllers/failure_policy.go), written once here for
admission (``webhook.kinds.jobset.rules``), ``explain`` (``webhook.kinds.jobset.simulate``) and
the audit's replay (``webhook.kinds.jobset.replay``).

- ``executeFailurePolicy``: without a ``failurePolicy`` the JobSet fails (``FailedJobs``).
  Otherwise ``findFirstFailedPolicyRuleAndJob`` takes the rules in order, each against the
  failed child Jobs, and the first rule that applies to one decides; none: the default
  action, ``RestartJobSet``.
- ``ruleIsApplicable``: every list the rule has must match the failed Job (an empty list
  matches anything): its ``Failed`` condition's reason among ``onJobFailureReasons``; its
  message matched by one of ``onJobFailureMessagePatterns`` (Go regexps, searched:
  ``anyMatchFound``; one that does not compile is skipped); its replicated Job among
  ``targetReplicatedJobs``.
- The actions: ``FailJobSet`` fails the JobSet (``FailJobSetFailurePolicyAction``);
  ``RestartJobSet`` fails it once ``status.restartsCountTowardsMax`` has reached
  ``maxRestarts`` (``ReachedMaxRestarts``), else recreates every child Job for a new run and
  counts the restart; ``RestartJobSetAndIgnoreMaxRestarts`` recreates them without counting
  and never checks ``maxRestarts``; ``RestartJob`` and ``RestartJobAndIgnoreMaxRestarts``
  (alpha gate ``RestartJob``) recreate the failed Job only. An action the controller does
  not know is an error there: the rule is skipped here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.kube.goregexp import Piece, Unsupported, compile_go
from webhook.kube.jobcontroller import POD_FAILURE_POLICY
from webhook.kube.objects import items, mapping

ACTIONS = (
    "FailJobSet",
    "RestartJobSet",
    "RestartJobSetAndIgnoreMaxRestarts",
    "RestartJob",
    "RestartJobAndIgnoreMaxRestarts",
)
#: The actions that restart the whole set (a new run), and those that recreate one Job.
RESTART_ACTIONS = ("RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")
SINGLE_JOB_RESTARTS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")
#: The actions that restart without counting against ``maxRestarts``.
IGNORING_ACTIONS = ("RestartJobSetAndIgnoreMaxRestarts", "RestartJobAndIgnoreMaxRestarts")
DEFAULT_ACTION = "RestartJobSet"
#: The JobSet's ``Failed`` reasons (pkg/constants).
FAILED_JOBS, FAIL_ACTION, MAX_REACHED = (
    "FailedJobs",
    "FailJobSetFailurePolicyAction",
    "ReachedMaxRestarts",
)


def pattern_applies(pattern: Any, message: Sequence[Piece]) -> tuple[bool, str]:
    """Whether a message pattern can match ``message`` (``anyMatchFound``), and, when it
    cannot be read as Go's regexp reads it, why (it is then taken to match)."""
    try:
        return compile_go(str(pattern)).search(message), ""
    except Unsupported as err:
        return True, str(err)


def rule_is_applicable(
    rule: Mapping[str, Any], reason: str, message: Sequence[Piece], replicated: str
) -> tuple[bool, str]:
    """``ruleIsApplicable`` for a Job of replicated Job ``replicated`` failed with
    ``reason`` and ``message`` (as pieces: a pattern matches when it does for some message
    of that shape), and why it was taken to apply when a pattern could not be read."""
    reasons = items(rule.get("onJobFailureReasons"))
    targets = items(rule.get("targetReplicatedJobs"))
    patterns = items(rule.get("onJobFailureMessagePatterns"))
    if (reasons and reason not in reasons) or (targets and replicated not in targets):
        return False, ""
    if not patterns:
        return True, ""
    unread = ""
    for pattern in patterns:
        hit, why = pattern_applies(pattern, message)
        if hit and not why:
            return True, ""
        unread = unread or (f"its pattern /{pattern}/ is taken to match: {why}" if hit else "")
    return bool(unread), unread


def first_rule(
    rules: Sequence[Any], reason: str, message: Sequence[Piece], replicated: str
) -> tuple[int | None, str, str]:
    """``findFirstFailedPolicyRuleAndJob`` for one failed Job: the first rule that applies
    (its index, ``None`` for none) and the action it takes (``DEFAULT_ACTION`` for none),
    and why a rule was taken to apply ("" when it surely does)."""
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict) or rule.get("action") not in ACTIONS:
            continue
        applies, why = rule_is_applicable(rule, reason, message, replicated)
        if applies:
            return index, str(rule["action"]), why
    return None, DEFAULT_ACTION, ""


@dataclass(frozen=True)
class Decision:
    """What ``executeFailurePolicy`` does once a child Job failed."""

    action: str  # the action taken ("": no failurePolicy)
    rule: int | None = None  # the rule that decided (``None``: none)
    name: str = ""  # its name (JobSet names an unnamed one ``failurePolicyRule<i>``)
    failed: str = ""  # the JobSet's Failed reason when it fails, else ""
    counted: bool = False  # a restart counted against maxRestarts
    unsure: str = ""  # why a rule was taken to apply that may not

    @property
    def words(self) -> str:
        """``its rule stop (FailJobSet)``, in a sentence."""
        if not self.action:
            return "no failurePolicy"
        if self.rule is None:
            return f"no rule ({self.action})"
        return f"its rule {self.name} ({self.action})"


def execute(
    jobset: Mapping[str, Any], reason: str, message: Sequence[Piece], replicated: str, toward: int
) -> Decision:
    """``executeFailurePolicy`` for a child Job of ``replicated`` failed with ``reason`` and
    ``message``, ``toward`` restarts counted so far (``restartsCountTowardsMax``)."""
    policy = mapping(jobset.get("spec")).get("failurePolicy")
    if not isinstance(policy, dict):
        return Decision("", failed=FAILED_JOBS)
    rules = items(policy.get("rules"))
    index, action, unsure = first_rule(rules, reason, message, replicated)
    name = ""
    if index is not None:
        name = str(mapping(rules[index]).get("name") or f"failurePolicyRule{index}")
    if action == "FailJobSet":
        return Decision(action, index, name, FAIL_ACTION, unsure=unsure)
    limit = policy.get("maxRestarts")
    limit = limit if isinstance(limit, int) and not isinstance(limit, bool) else 0
    counted = action not in IGNORING_ACTIONS
    if counted and toward >= limit:
        return Decision(action, index, name, MAX_REACHED, unsure=unsure)
    return Decision(action, index, name, counted=counted, unsure=unsure)


# --- peer-disruptions on a JobSet ---------------------------------------------------------
# One write per disruption instead of one per peer: the controller adds ``FailureTarget``
# to the disrupted pod's child Job; the Job controller's ``syncJob`` finishes a Job that has
# ``FailureTarget=True`` as ``Failed`` with that condition's reason and message
# (``newFailedConditionForFailureTarget``) and deletes its active pods; the rule below,
# first in the JobSet's rules, applies to that Job (``ruleIsApplicable``: its reason, its
# message) and restarts the set: the peers stop with the restart, none needs a mark.
# JobSet's webhook accepts only the Job controller's reasons in ``onJobFailureReasons``
# (``validOnJobFailureReasons``), hence ``PodFailurePolicy``; the message, which no Job
# controller failure starts with, tells ours apart.
PEER_RULE_NAME = "retryPolicyPeerDisruptions"
PEER_REASON = POD_FAILURE_POLICY
PEER_MESSAGE_PREFIX = "retry-policy.dev/PeerDisrupted: "
PEER_PATTERN = r"^retry-policy\.dev/PeerDisrupted: "
#: The Job condition the controller adds, and those that say a Job's end is decided
#: already (it is not written then: the Job's own end decides).
FAILURE_TARGET = "FailureTarget"
DECIDED_CONDITIONS = (FAILURE_TARGET, "Failed", "Complete", "SuccessCriteriaMet")


def peer_action(how: str) -> str:
    """The action of the peer rule for ``peer-disruptions: how``."""
    return "RestartJobSetAndIgnoreMaxRestarts" if how == "ignore" else "RestartJobSet"


def peer_rule(how: str) -> dict[str, Any]:
    """The rule admission puts first in a JobSet's ``failurePolicy.rules``."""
    return {
        "name": PEER_RULE_NAME,
        "action": peer_action(how),
        "onJobFailureReasons": [PEER_REASON],
        "onJobFailureMessagePatterns": [PEER_PATTERN],
    }


def peer_message(pod: str, cause: str, how: str) -> str:
    """The message of the ``FailureTarget`` the controller adds (and of the Job's
    ``Failed``, which the Job controller copies from it)."""
    return f"{PEER_MESSAGE_PREFIX}pod {pod} was disrupted ({cause}); peer-disruptions {how}"


def peer_rule_of(jobset: Mapping[str, Any]) -> str | None:
    """The ``peer-disruptions`` value whose rule is first in the JobSet's rules (``None``:
    no such rule there, as in a JobSet admitted before the rule was written)."""
    rules = items(mapping(mapping(jobset.get("spec")).get("failurePolicy")).get("rules"))
    first = mapping(rules[0]) if rules else {}
    for how in ("ignore", "count"):
        if first == peer_rule(how):
            return how
    return None
