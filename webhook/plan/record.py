"""The ``retry-policy.dev/applied`` record: what the webhook applied, written on the object."""

from __future__ import annotations

from typing import Any

import orjson

from webhook.policy.model import Policy, format_value


def applied_record(policy: Policy) -> str:
    """The compact, deterministic record written to ``retry-policy.dev/applied``."""
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
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()
