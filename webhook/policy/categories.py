"""Failure categories: why a pod failed, in one word a tool can read.

The controller classifies every failed pod of a managed workload, and every pod it ends
past its ``start-deadline``, into exactly one category (``webhook.cluster.classify``) and
writes it on the pod as the condition ``retry-policy.dev/<Category>`` (status True, reason
the signal that matched, message the category's hint). A ``podFailurePolicy`` rule can
match only exit codes and a condition's type, so a category becomes something a rule can
act on: ``free-categories`` (Ignore), ``fail-categories`` (FailJob, FailIndex),
``max-free-failures`` (Count on ``retry-policy.dev/FreeBudgetExhausted``).

The built-in categories (``BUILTIN``; their names are a contract) come after the admins'
own, which the cluster config lists under ``categories:`` (``parse``): each a ``name`` (a
condition type's name part), a ``hint`` and a ``match`` on any of ``exitCodes``,
``containerReasons``, ``terminationMessage`` (Go's RE2 syntax, as every pattern of ours:
``webhook.kube.goregexp``), ``podReasons``, ``disruptionReasons``, ``eventReasons`` (with
an optional ``eventMessage`` pattern). Admins' categories are tried first, in order; the
first match wins. An admin's category may bear a built-in name (its own patterns for
``DeviceFault``, say): it then needs no hint of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.kube.goregexp import Program, Unsupported, compile_go
from webhook.policy.grammar import BadValue
from webhook.problems import Problem

PREFIX = "retry-policy.dev/"

OOM_KILLED = "OOMKilled"
DEVICE_FAULT = "DeviceFault"
NODE_FAILURE = "NodeFailure"
PREEMPTED = "Preempted"
IMAGE_PULL = "ImagePull"
CONFIG_ERROR = "ConfigError"
UNSCHEDULABLE = "Unschedulable"
START_TIMEOUT = "StartTimeout"
APP_ERROR = "AppError"

#: The built-in categories and their hints, in the order the classifier tries them after
#: the admins' (``webhook.cluster.classify``).
BUILTIN_HINTS: dict[str, str] = {
    DEVICE_FAULT: "a device the pod used (a GPU) failed: its hardware or driver, not your code",
    NODE_FAILURE: "the pod's node failed or was lost (unreachable, shut down, under pressure): "
    "not your code",
    PREEMPTED: "the pod was preempted or evicted to make room or to drain its node: not your code",
    IMAGE_PULL: "an image could not be pulled: check its name, tag and pull secrets",
    CONFIG_ERROR: "a container could not be created from its spec: check its ConfigMaps, "
    "Secrets, volumes and command",
    UNSCHEDULABLE: "no node could run the pod: check its requests, node selectors, affinity "
    "and tolerations",
    START_TIMEOUT: "the pod's containers did not all start within its start-deadline",
    OOM_KILLED: "a container ran out of memory and was killed: raise its memory, or set "
    "oom-memory-factor",
    APP_ERROR: "the application failed: see its logs and exit code",
}
BUILTIN = tuple(BUILTIN_HINTS)
#: Categories a pod ended past its start deadline may have (besides an admin's).
START_CATEGORIES = (IMAGE_PULL, CONFIG_ERROR, UNSCHEDULABLE, START_TIMEOUT)
#: The conditions of ours that are no category (budgets per cause, the free budget).
NOT_CATEGORIES = frozenset(
    {"DisruptionBudgetExhausted", "InPlaceBudgetExhausted", "PeerDisrupted", "FreeBudgetExhausted"}
)
#: A category's name: the name part of a qualified name (``ValidateQualifiedName``), so
#: that ``retry-policy.dev/<name>`` is a valid condition type.
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
MAX_CATEGORIES = 64
MAX_HINT = 256
MAX_LIST = 64
_MATCH_KEYS = (
    "exitCodes",
    "containerReasons",
    "terminationMessage",
    "podReasons",
    "disruptionReasons",
    "eventReasons",
    "eventMessage",
)
_KEYS = ("name", "hint", "match")
_REASON = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.:]{0,127}")


def condition_type(name: str) -> str:
    """The pod condition a category is written as."""
    return PREFIX + name


def category_of(condition: str) -> str | None:
    """The category a condition type of ours names (``None``: not a category's)."""
    if not condition.startswith(PREFIX):
        return None
    name = condition[len(PREFIX) :]
    return name if name not in NOT_CATEGORIES and _NAME.fullmatch(name) else None


def named_by(rule: Any) -> list[str]:
    """The categories a podFailurePolicy rule's condition patterns name."""
    patterns = rule.get("onPodConditions") if isinstance(rule, dict) else None
    names = (category_of(str(p.get("type") or "")) for p in patterns or () if isinstance(p, dict))
    return [name for name in names if name is not None]


@dataclass(frozen=True)
class Pattern:
    """A Go regular expression, kept with its source."""

    source: str
    program: Program = field(compare=False, repr=False)

    def search(self, text: str) -> bool:
        return self.program.search([text])


@dataclass(frozen=True)
class Match:
    """What an admin's category matches: any one of these (see the module's doc)."""

    exit_codes: frozenset[int] = frozenset()
    container_reasons: frozenset[str] = frozenset()
    termination_message: Pattern | None = None
    pod_reasons: frozenset[str] = frozenset()
    disruption_reasons: frozenset[str] = frozenset()
    event_reasons: frozenset[str] = frozenset()
    event_message: Pattern | None = None

    @property
    def needs_events(self) -> bool:
        return bool(self.event_reasons) or self.event_message is not None


@dataclass(frozen=True)
class Category:
    """One category: an admin's (with ``match``) or a built-in one (``match`` None)."""

    name: str
    hint: str
    match: Match | None = None

    @property
    def condition(self) -> str:
        return condition_type(self.name)


def builtin(name: str) -> Category:
    return Category(name, BUILTIN_HINTS[name])


def names(configured: Iterable[Category]) -> tuple[str, ...]:
    """Every category there is: the admins' (in order), then the built-in ones."""
    seen = [c.name for c in configured]
    return tuple(dict.fromkeys([*seen, *BUILTIN]))


def hint_of(name: str, configured: Iterable[Category]) -> str:
    for category in configured:
        if category.name == name:
            return category.hint
    return BUILTIN_HINTS.get(name, "")


# --- the annotations' grammar ------------------------------------------------------------


def parse_names(text: str) -> tuple[str, ...] | None:
    """``DeviceFault,NodeFailure``: category names (whether each exists is the cluster
    config's to say: checked at admission); ``none`` turns off a default."""
    if text == "none":
        return None
    accepted = (
        "accepted: a comma-separated list of category names, e.g. DeviceFault,NodeFailure "
        f"(built in: {', '.join(BUILTIN)}; and the cluster's own), or none to turn off a "
        "default"
    )
    parts = [part.strip() for part in text.split(",")]
    for part in parts:
        if not part:
            raise BadValue(f"an element is empty; {accepted}")
        if _NAME.fullmatch(part) is None:
            raise BadValue(f"{part[:64]!r} is not a category name; {accepted}")
    return tuple(sorted(set(parts)))


def format_names(value: Sequence[str] | None) -> str:
    return "none" if not value else ",".join(value)


# --- the cluster config's ``categories:`` -----------------------------------------------


def parse(raw: Any, problems: list[Problem]) -> tuple[Category, ...]:
    """The config's ``categories:`` list; every problem found goes to ``problems``, each
    naming the category."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(Problem("categories", "must be a list of categories (name, hint, match)"))
        return ()
    if len(raw) > MAX_CATEGORIES:
        problems.append(Problem("categories", f"has {len(raw)} entries; at most {MAX_CATEGORIES}"))
    found: list[Category] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw[:MAX_CATEGORIES]):
        category = _category(entry, index, seen, problems)
        if category is not None:
            found.append(category)
            seen.add(category.name)
    return tuple(found)


def _category(entry: Any, index: int, seen: set[str], problems: list[Problem]) -> Category | None:
    if not isinstance(entry, dict):
        problems.append(Problem(f"categories[{index}]", "must be a mapping: name, hint, match"))
        return None
    name = entry.get("name")
    where = f"categories[{index}]" + (f" ({name})" if isinstance(name, str) else "")
    before = len(problems)
    for key in entry:
        if key not in _KEYS:
            problems.append(Problem(f"{where}.{key}", f"unknown key; allowed: {', '.join(_KEYS)}"))
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        problems.append(
            Problem(
                f"{where}.name",
                f"{name!r} is not a category name: letters, digits, -, _ and ., at most 63, "
                "starting and ending with a letter or digit (it becomes the pod condition "
                "retry-policy.dev/<name>)",
            )
        )
    elif name in NOT_CATEGORIES:
        problems.append(Problem(f"{where}.name", f"{name} is a condition of the controller's own"))
    elif name in seen:
        problems.append(
            Problem(f"{where}.name", f"{name} is named twice; give one entry all its patterns")
        )
    hint = entry.get("hint")
    if hint is None and isinstance(name, str) and name in BUILTIN_HINTS:
        hint = BUILTIN_HINTS[name]
    if not isinstance(hint, str) or not hint.strip() or len(hint) > MAX_HINT:
        problems.append(
            Problem(
                f"{where}.hint",
                f"needs a hint: a sentence for the people whose pods fail this way (at most "
                f"{MAX_HINT} characters)",
            )
        )
    match = _match(entry.get("match"), where, problems)
    if len(problems) > before or not isinstance(name, str) or not isinstance(hint, str):
        return None
    return Category(name, hint.strip(), match)


def _match(raw: Any, where: str, problems: list[Problem]) -> Match | None:
    at = f"{where}.match"
    if not isinstance(raw, dict) or not raw:
        problems.append(Problem(at, f"needs a mapping with any of {', '.join(_MATCH_KEYS)}"))
        return None
    for key in raw:
        if key not in _MATCH_KEYS:
            problems.append(
                Problem(f"{at}.{key}", f"unknown key; allowed: {', '.join(_MATCH_KEYS)}")
            )
    codes: set[int] = set()
    for code in _list(raw, "exitCodes", at, problems):
        if isinstance(code, int) and not isinstance(code, bool) and 1 <= code <= 255:
            codes.add(code)
        else:
            problems.append(Problem(f"{at}.exitCodes", f"{code!r} is not an exit code 1..255"))
    reasons = {
        key: frozenset(_reasons(raw, key, at, problems))
        for key in ("containerReasons", "podReasons", "disruptionReasons", "eventReasons")
    }
    message = _pattern(raw.get("terminationMessage"), f"{at}.terminationMessage", problems)
    event_message = _pattern(raw.get("eventMessage"), f"{at}.eventMessage", problems)
    return Match(
        frozenset(codes),
        reasons["containerReasons"],
        message,
        reasons["podReasons"],
        reasons["disruptionReasons"],
        reasons["eventReasons"],
        event_message,
    )


def _list(raw: Mapping[str, Any], key: str, at: str, problems: list[Problem]) -> list[Any]:
    value = raw.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not value or len(value) > MAX_LIST:
        problems.append(Problem(f"{at}.{key}", f"must be a list of 1 to {MAX_LIST} entries"))
        return []
    return value


def _reasons(raw: Mapping[str, Any], key: str, at: str, problems: list[Problem]) -> list[str]:
    out = []
    for reason in _list(raw, key, at, problems):
        if isinstance(reason, str) and _REASON.fullmatch(reason):
            out.append(reason)
        else:
            problems.append(
                Problem(
                    f"{at}.{key}",
                    f"{reason!r} is not a reason (a CamelCase word such as "
                    "OOMKilled or DeletionByTaintManager)",
                )
            )
    return out


def _pattern(raw: Any, at: str, problems: list[Problem]) -> Pattern | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw:
        problems.append(Problem(at, "must be a regular expression (Go's RE2 syntax)"))
        return None
    try:
        program = compile_go(raw)
    except Unsupported as err:
        problems.append(
            Problem(at, f"{raw[:80]!r} is not a pattern this webhook reads as Go does: {err}")
        )
        return None
    if program.matches_everything():
        problems.append(Problem(at, f"{raw[:80]!r} matches every text: it would say nothing"))
        return None
    return Pattern(raw, program)


def check_names(wanted: Sequence[str], configured: Iterable[Category]) -> tuple[list[str], str]:
    """The names of ``wanted`` that are no category, and the categories there are (for the
    denial)."""
    known = names(configured)
    unknown = [name for name in wanted if name not in known]
    return unknown, ", ".join(known)
