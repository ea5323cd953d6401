"""The ``retry-policy.dev/applied`` record: what the webhook applied, written on the object.

One writer (``AppliedRecord.to_annotation``, through ``AppliedRecord.write``) and one parser
(``AppliedRecord.of``) for every reader: the CronJob and JobSet mutators (what an earlier
admission wrote), ``status`` (the settings the admins' defaults made, which rules are the
webhook's), the controller (whose rules failed a Job), a pod's own record.

The record is compact JSON with sorted keys (it is written on every annotated workload):

- the settings applied (``backoffLimit``, ``failNonRetriable``: the retriable codes, ...),
  as the version-1 record had them; a pod's: its attempt and what its admission did
  (``attempt``, ``attempts``, ``nonSpot``, ``memoryRaised``, ...);
- ``origins``: which annotation wrote which of the webhook's rules (podFailurePolicy rules,
  a JobSet's failure policy rule, containers' restart rules), recorded when they were
  written, never matched back by their shape: by annotation, the ids of its rules
  (``rule_id``: 8 hex digits of the rule's digest, comma-separated);
- ``v``: the format, ``VERSION``. A record without ``v`` is version 1, as written before
  (no origins): still read, and readers that need the origins fall back to recognising
  the rules by shape.

Idempotent: an object whose record says what would be written now keeps its record as it
is, a version-1 record too (``write``): re-admitting an object the previous version
mutated changes nothing that is not changed anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.kube import podspec
from webhook.kube.objects import mapping
from webhook.policy.model import APPLIED, Policy, format_value

#: The format this version writes. 1: the record without ``v`` (and without ``origins``).
VERSION = 2
#: The keys of the format, besides the settings.
VERSION_KEY, ORIGINS_KEY = "v", "origins"


def rule_id(rule: Mapping[str, Any]) -> str:
    """A rule's id in ``origins``: the first 8 hex digits of the SHA-256 of its JSON (keys
    sorted). The rules recorded are the webhook's own, built fresh for each object, so the
    rule as stored (the API server adds nothing to them) has the same id."""
    text = orjson.dumps(rule, option=orjson.OPT_SORT_KEYS)
    found = _IDS.get(text)
    if found is None:
        if len(_IDS) >= _IDS_MAX:
            _IDS.clear()
        found = _IDS[text] = hashlib.sha256(text).hexdigest()[:8]
    return found


#: Rule ids by the rule's JSON: the same few rules are written on every Job of a template.
_IDS: dict[bytes, str] = {}
_IDS_MAX = 4096


@dataclass(frozen=True)
class AppliedRecord:
    """The record on one object: ``settings`` (every key but ``v`` and ``origins``),
    ``origins`` (rule id -> the annotation, by short name, that wrote the rule) and the
    format ``version``."""

    settings: Mapping[str, Any] = field(default_factory=dict)
    origins: Mapping[str, str] = field(default_factory=dict)
    version: int = VERSION

    # --- reading -------------------------------------------------------------------------
    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> AppliedRecord | None:
        """The record on ``obj`` (``None``: none, or not a record this webhook wrote)."""
        return cls.parse(mapping(mapping(obj.get("metadata")).get("annotations")).get(APPLIED))

    @classmethod
    def parse(cls, raw: Any) -> AppliedRecord | None:
        """The record from the annotation's text (``None``: absent or unreadable)."""
        if not isinstance(raw, str):
            return None
        try:
            found = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(found, dict):
            return None
        version = found.pop(VERSION_KEY, 1)
        if not isinstance(version, int) or isinstance(version, bool):
            return None
        grouped = found.pop(ORIGINS_KEY, None) if version >= 2 else None
        origins: dict[str, str] = {}
        for name, ids in mapping(grouped).items():
            if isinstance(name, str) and isinstance(ids, str):
                origins.update(dict.fromkeys(filter(None, ids.split(",")), name))
        return cls(found, origins, version)

    def get(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.settings

    def origin(self, rule: Any) -> str | None:
        """The annotation that wrote ``rule``, by short name, as recorded (``None``: not a
        rule this webhook recorded writing; a version-1 record records none)."""
        if not self.origins or not isinstance(rule, dict):
            return None
        return self.origins.get(rule_id(rule))

    # --- writing -------------------------------------------------------------------------
    def to_annotation(self) -> str:
        """The annotation's text: compact, keys sorted, ``v`` from version 2 on."""
        record = dict(self.settings)
        if self.version >= 2:
            record[VERSION_KEY] = self.version
            if self.origins:
                grouped: dict[str, list[str]] = {}
                for rid, name in self.origins.items():
                    grouped.setdefault(name, []).append(rid)
                record[ORIGINS_KEY] = {name: ",".join(sorted(ids)) for name, ids in grouped.items()}
        return orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()

    def says(self, other: AppliedRecord) -> bool:
        """Whether this record (the one an object has) says what ``other`` (the one to
        write now) would: the same settings, and, when it records origins at all, the
        same origins (a version-1 record is kept, not rewritten for the format alone)."""
        if dict(self.settings) != dict(other.settings):
            return False
        return self.version < 2 or dict(self.origins) == dict(other.origins)

    def write(self, metadata: Any, current: AppliedRecord | None) -> bool:
        """Write this record on an object's ``metadata``, unless ``current``, the record it
        has (``AppliedRecord.of``), says the same (``says``); whether it changed."""
        if current is not None and current.says(self):
            return False
        return podspec.set_annotation(metadata, APPLIED, self.to_annotation())

    @classmethod
    def of_policy(cls, policy: Policy, origins: Mapping[str, str] | None = None) -> AppliedRecord:
        """The record of a workload admitted with ``policy`` (resolved against its spec),
        whose rules ``origins`` says the annotations wrote."""
        return cls(policy_settings(policy), dict(origins or {}))


def policy_settings(policy: Policy) -> dict[str, Any]:
    """The settings a workload's record keeps of its resolved policy."""
    record: dict[str, Any] = {}
    if policy.backoff_limit is not None:
        record["backoffLimit"] = policy.backoff_limit
    if policy.fail_non_retriable:
        record["failNonRetriable"] = list(policy.retriable_exit_codes)
        if policy.on_non_retriable != "fail-job":
            record["onNonRetriable"] = policy.on_non_retriable
        if policy.count_disruptions:
            record["countDisruptions"] = True
    if policy.ignore_disruptions:
        record["ignoreDisruptions"] = True
    if policy.non_spot_attempts:
        record["nonSpotAttempts"] = policy.non_spot_attempts
    if policy.error_propagation:
        record["errorPropagation"] = policy.error_propagation
    factor, limit = policy.oom_memory_factor, policy.oom_memory_limit
    if factor is not None and limit is not None:
        record["oomMemoryFactor"] = format_value("oom-memory-factor", factor)
        record["oomMemoryLimit"] = str(limit)
    if policy.avoid_failed_nodes:
        record["avoidFailedNodes"] = True
    if policy.in_place_exit_codes:
        record["inPlaceExitCodes"] = list(policy.in_place_exit_codes)
        record["inPlaceScope"] = policy.in_place_scope
        if policy.max_in_place_restarts is not None:
            record["maxInPlaceRestarts"] = policy.max_in_place_restarts
    if policy.ignore_disruptions and policy.max_disruptions is not None:
        record["maxDisruptions"] = policy.max_disruptions
    if policy.peer_disruptions is not None:
        record["peerDisruptions"] = policy.peer_disruptions
    if policy.attempt_env:
        record["attemptEnv"] = True
    if policy.retry_delay is not None:
        record["retryDelay"] = format_value("retry-delay", policy.retry_delay)
        if policy.retry_delay_factor != 1:
            record["retryDelayFactor"] = format_value(
                "retry-delay-factor", policy.retry_delay_factor
            )
        if policy.retry_delay_max is not None:
            record["retryDelayMax"] = format_value("retry-delay-max", policy.retry_delay_max)
    return record


#: The record's settings that hold an annotation's value as written (``policy_settings``).
_AS_WRITTEN = {
    "backoffLimit": "backoff-limit",
    "onNonRetriable": "on-non-retriable",
    "nonSpotAttempts": "non-spot-attempts",
    "errorPropagation": "error-propagation",
    "oomMemoryFactor": "oom-memory-factor",
    "oomMemoryLimit": "oom-memory-limit",
    "inPlaceScope": "in-place-scope",
    "maxDisruptions": "max-disruptions",
    "maxInPlaceRestarts": "max-in-place-restarts",
    "peerDisruptions": "peer-disruptions",
    "retryDelay": "retry-delay",
    "retryDelayFactor": "retry-delay-factor",
    "retryDelayMax": "retry-delay-max",
}
#: The record's flags (``True`` when on), by the annotation that turns each on.
_FLAGS = {
    "ignoreDisruptions": "ignore-disruptions",
    "avoidFailedNodes": "avoid-failed-nodes",
    "attemptEnv": "attempt-env",
}


def settings_as_annotations(record: AppliedRecord) -> dict[str, str]:
    """The record's settings said back as annotations (name without the prefix -> value):
    ``policy_settings`` read backwards, so that a reader (``status``) can judge a stored
    workload with the settings it was admitted with. A setting the record cannot say
    (a value of the wrong type: an older or damaged record) is left out, not guessed."""
    out: dict[str, str] = {}
    for key, name in _AS_WRITTEN.items():
        value = record.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            # the record keeps Flyte's strategy name ("Earliest"), the annotation ours
            out[name] = format_value(name, value) if name == "error-propagation" else str(value)
    for key, name in _FLAGS.items():
        if record.get(key) is True:
            out[name] = "true"
    codes = record.get("failNonRetriable")
    if isinstance(codes, list):
        out["fail-non-retriable"] = "true"
        out["retriable-exit-codes"] = ",".join(str(c) for c in codes)
    in_place = record.get("inPlaceExitCodes")
    if isinstance(in_place, list):
        out["in-place-exit-codes"] = ",".join(str(c) for c in in_place)
    return out
