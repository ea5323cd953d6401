"""The annotations' value grammars: one strict parser (and, where a value is written back,
one formatter) per kind of value.

Annotations are the user interface of this project, so each value has one strict grammar
(no YAML-ish guessing, no unicode digits, no floats) and every rejection (``BadValue``)
says what would have been accepted. ``policy.model`` names which key takes which grammar.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from fractions import Fraction

from webhook.kube import quantity
from webhook.kube.defaulting import INT32_MAX


class BadValue(ValueError):
    """A value that does not match its key's grammar; the text says what is accepted."""


_UINT = re.compile(r"[0-9]{1,10}")
_CODE_LIST = re.compile(r"[0-9]{1,3}( *, *[0-9]{1,3})*")


def parse_bool(text: str) -> bool:
    if text == "true":
        return True
    if text == "false":
        return False
    raise BadValue("accepted: true or false")


def parse_count(text: str) -> int:
    if _UINT.fullmatch(text) is None or int(text) > INT32_MAX:
        raise BadValue(f"accepted: a whole number from 0 to {INT32_MAX}")
    return int(text)


def parse_exit_codes(text: str) -> tuple[int, ...]:
    """Parse ``143,137`` into the sorted, de-duplicated tuple the Job API requires."""
    accepted = "accepted: a comma-separated list of exit codes from 1 to 255, e.g. 143,137"
    if _CODE_LIST.fullmatch(text.strip()) is None:
        raise BadValue(_bad_element(text) + accepted)
    codes = sorted({int(part) for part in text.split(",")})
    if codes[0] < 1 or codes[-1] > 255:
        raise BadValue(_bad_element(text) + accepted)
    return tuple(codes)


def _bad_element(text: str) -> str:
    """What is wrong with the first bad element of a list of exit codes, pointed at
    ("300 is out of range; "), or "" when it is the list's shape (an empty element...)."""
    for part in (p.strip() for p in text.split(",")):
        if not part:
            return "an element is empty; "
        if not (part.isascii() and part.isdigit()):
            return f"{part!r} is not a whole number; "
        if not 1 <= int(part) <= 255:
            return f"{int(part)} is out of range; "
    return ""


def parse_in_place_codes(text: str) -> tuple[int, ...] | None:
    """Exit codes a container restarts in place on; ``none`` turns off a default."""
    if text == "none":
        return None
    if any(part.strip().isdigit() and int(part) == 0 for part in text.split(",")):
        raise BadValue(
            "0 is success: a rule on it would restart a container that finished; accepted: "
            "a comma-separated list of exit codes from 1 to 255, e.g. 42,75, or none"
        )
    try:
        return parse_exit_codes(text)
    except BadValue:
        raise BadValue(
            _bad_element(text) + "accepted: a comma-separated list of exit codes from 1 to "
            "255, e.g. 42,75, or none to turn off a default"
        ) from None


def parse_in_place_scope(text: str) -> str:
    """What restarts in place: the container that exited, or every container of the pod."""
    if text in ("container", "pod"):
        return text
    raise BadValue("accepted: container (the container that exited) or pod (all its containers)")


def parse_strategy(text: str) -> str | None:
    """``earliest`` -> the Flyte strategy name; ``none`` opts out of a default."""
    if text == "earliest":
        return "Earliest"
    if text == "none":
        return None
    raise BadValue("accepted: earliest, or none to turn off a default")


def parse_on_non_retriable(text: str) -> str:
    """What a non-retriable exit fails: the whole Job, or only its index (Indexed Jobs)."""
    if text in ("fail-job", "fail-index"):
        return text
    raise BadValue("accepted: fail-job, or fail-index (Indexed Jobs with backoffLimitPerIndex)")


def parse_any(text: str) -> str:
    return text


def parse_restart_budget(text: str) -> int:
    """In-place restarts a pod may make in all before it is replaced (at least 1)."""
    if _UINT.fullmatch(text) is None or not 1 <= int(text) <= INT32_MAX:
        raise BadValue(
            f"accepted: a whole number from 1 to {INT32_MAX} (0 would replace every pod at "
            "its first restart in place: remove in-place-exit-codes instead)"
        )
    return int(text)


def parse_peer_disruptions(text: str) -> str | None:
    """What the failure of a disrupted pod's peers does: ignored, or counted like any
    retriable failure; ``none`` turns off a default."""
    if text in ("ignore", "count"):
        return text
    if text == "none":
        return None
    raise BadValue(
        "accepted: ignore (a disrupted pod's peers fail free), count (they count against "
        "the retry budget), or none to turn off a default"
    )


_FACTOR = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3})?")


def parse_factor(text: str) -> Fraction | None:
    """A decimal above 1 (exact: ``1.5`` is 3/2); ``none`` turns off a default."""
    if text == "none":
        return None
    if _FACTOR.fullmatch(text) is None or Fraction(text) <= 1:
        raise BadValue(
            "accepted: a decimal number above 1 with at most 3 decimal places, e.g. 1.5, "
            "or none to turn off a default"
        )
    return Fraction(text)


#: The longest retry delay any setting may ask for (``retry-delay``, ``retry-delay-max``):
#: a gated pod holds its Job's place (it counts as active) the whole time.
MAX_DELAY_SECONDS = 7 * 24 * 3600
_DURATION = re.compile(r"(?:([0-9]{1,3})h)?(?:([0-9]{1,5})m)?(?:([0-9]{1,6})s)?")
_UNITS = (("h", 3600), ("m", 60), ("s", 1))


def parse_duration(text: str) -> int | None:
    """A delay in whole seconds from ``30s``, ``5m``, ``1h``, ``1h30m`` (hours, minutes,
    seconds in that order, each at most once); ``none`` turns off a default."""
    if text == "none":
        return None
    match = _DURATION.fullmatch(text)
    seconds = (
        sum(int(part or 0) * unit for part, (_, unit) in zip(match.groups(), _UNITS, strict=True))
        if match is not None and text
        else 0
    )
    if not 1 <= seconds <= MAX_DELAY_SECONDS:
        raise BadValue(
            "accepted: a duration from 1s to 168h in whole hours, minutes and seconds, "
            "e.g. 30s, 5m, 1h30m, or none to turn off a default"
        )
    return seconds


#: The fewest seconds ``start-deadline`` takes: a pod is given at least this long to be
#: scheduled, pull its images and start.
MIN_START_DEADLINE = 10


def parse_start_deadline(text: str) -> int | None:
    """How long a pod may take to start all its containers (``parse_duration``), at least
    ``MIN_START_DEADLINE`` seconds; ``none`` turns off a default."""
    accepted = (
        f"accepted: a duration from {MIN_START_DEADLINE}s to 168h, e.g. 15m (a pod needs "
        "time to be scheduled, pull its images and start), or none to turn off a default"
    )
    try:
        seconds = parse_duration(text)
    except BadValue:
        raise BadValue(accepted) from None
    if seconds is not None and seconds < MIN_START_DEADLINE:
        raise BadValue(accepted)
    return seconds


def format_duration(seconds: int | None) -> str:
    """Whole seconds back in duration grammar: ``90`` -> ``1m30s`` (the inverse of
    ``parse_duration``)."""
    if seconds is None:
        return "none"
    if seconds <= 0:
        return "0s"
    parts = []
    for name, unit in _UNITS:
        count, seconds = divmod(seconds, unit)
        if count:
            parts.append(f"{count}{name}")
    return "".join(parts)


def parse_delay_factor(text: str) -> Fraction:
    """A decimal of at least 1 (exact: ``1.5`` is 3/2); 1 keeps every delay the same."""
    if _FACTOR.fullmatch(text) is None or Fraction(text) < 1:
        raise BadValue(
            "accepted: a decimal number of at least 1 with at most 3 decimal places, "
            "e.g. 2 or 1.5 (1: every retry waits the same)"
        )
    return Fraction(text)


#: ``retry-policy.dev/not-before``: when a gated pod may be scheduled, RFC 3339 in UTC.
_STAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


def parse_time(text: str) -> float:
    """An RFC 3339 time in UTC to the second (``2026-11-26T10:00:00Z``) as Unix time."""
    accepted = "accepted: an RFC 3339 time in UTC such as 2026-11-26T10:00:00Z"
    if _STAMP.fullmatch(text) is None:
        raise BadValue(accepted)
    try:
        when = dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise BadValue(accepted) from None
    return when.replace(tzinfo=dt.timezone.utc).timestamp()


def format_time(when: float) -> str:
    """Unix time as ``parse_time`` reads it (rounded up to the second: never earlier)."""
    stamp = dt.datetime.fromtimestamp(math.ceil(when), dt.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_memory(text: str) -> quantity.Quantity:
    """A Kubernetes quantity above 0 (``8Gi``, ``16G``, ``12e9``)."""
    accepted = "accepted: a memory quantity above 0, e.g. 8Gi or 16G"
    try:
        value = quantity.parse(text)
    except quantity.QuantityError:
        raise BadValue(accepted) from None
    if value.value <= 0:
        raise BadValue(accepted)
    return value


def format_factor(value: Fraction) -> str:
    """``3/2`` as ``1.5`` (factors are decimals of at most 3 places)."""
    whole, rest = divmod(value.numerator * 1000 // value.denominator, 1000)
    return f"{whole}.{rest:03d}".rstrip("0").rstrip(".") if rest else str(whole)
