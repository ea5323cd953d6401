"""Annotation grammars, unknown keys, scopes and precedence."""

from __future__ import annotations

import pytest

from webhook.policy.model import (
    Layer,
    Scope,
    Source,
    format_value,
    parse_annotations,
    resolve,
)

P = "retry-policy.dev/"


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("fail-non-retriable", "true", True),
        ("fail-non-retriable", "false", False),
        ("ignore-disruptions", "true", True),
        ("backoff-limit", "0", 0),
        ("backoff-limit", "2147483647", 2147483647),
        ("non-spot-attempts", "2", 2),
        ("retriable-exit-codes", "143", (143,)),
        ("retriable-exit-codes", "143,137", (137, 143)),
        ("retriable-exit-codes", "143, 137 ,143", (137, 143)),
        ("retriable-exit-codes", "1,255", (1, 255)),
        ("error-propagation", "earliest", "Earliest"),
        ("error-propagation", "none", None),
    ],
)
def test_valid_values_parse(key, raw, expected):
    values, problems = parse_annotations({P + key: raw}, Scope.WORKLOAD)
    assert problems == []
    assert values[key] == expected


@pytest.mark.parametrize(
    ("key", "value", "pointed"),
    [
        ("retriable-exit-codes", "143, 137, 300", "300 is out of range; "),
        ("retriable-exit-codes", "143,0", "0 is out of range; "),
        ("retriable-exit-codes", "143,x", "'x' is not a whole number; "),
        ("retriable-exit-codes", "143,,137", "an element is empty; "),
        ("in-place-exit-codes", "42,256", "256 is out of range; "),
    ],
)
def test_a_bad_element_of_a_list_is_pointed_at(key, value, pointed):
    _, (problem,) = parse_annotations({P + key: value}, Scope.WORKLOAD)
    assert problem.message.startswith(f"{value!r} is not valid; {pointed}accepted: ")


def test_unknown_key_suggests_closest():
    _, problems = parse_annotations({P + "backof-limit": "3"}, Scope.WORKLOAD)
    assert len(problems) == 1
    assert "did you mean retry-policy.dev/backoff-limit?" in str(problems[0])
    assert problems[0].reason == "unknown-key"


def test_unknown_key_without_close_match_lists_known_keys():
    _, problems = parse_annotations({P + "zzz": "3"}, Scope.WORKLOAD)
    assert "known keys:" in str(problems[0])
    assert P + "fail-non-retriable" in str(problems[0])


def test_every_problem_reported_at_once():
    _, problems = parse_annotations(
        {P + "backoff-limit": "x", P + "nope": "1", P + "fail-non-retriable": "maybe"},
        Scope.WORKLOAD,
    )
    assert len(problems) == 3


def test_other_prefixes_are_ignored():
    values, problems = parse_annotations(
        {"example.com/backoff-limit": "x", "retry-policy.dev.evil/x": "1"}, Scope.WORKLOAD
    )
    assert (values, problems) == ({}, [])


def test_attempt_is_pod_only():
    _, problems = parse_annotations({P + "attempt": "1"}, Scope.WORKLOAD)
    assert problems[0].reason == "wrong-scope"
    values, problems = parse_annotations({P + "attempt": "1"}, Scope.POD)
    assert (values, problems) == ({"attempt": 1}, [])


def test_workload_only_keys_rejected_on_pods():
    _, problems = parse_annotations({P + "fail-non-retriable": "true"}, Scope.POD)
    assert problems[0].reason == "wrong-scope"


def test_non_string_values_are_problems():
    _, problems = parse_annotations({P + "backoff-limit": 3}, Scope.WORKLOAD)
    assert "must be strings" in str(problems[0])


def test_control_characters_are_escaped_in_messages():
    _, problems = parse_annotations({P + "backoff-limit": "3\n\x1b[31m"}, Scope.WORKLOAD)
    assert "\n" not in str(problems[0]) and "\x1b" not in str(problems[0])


def test_resolution_precedence_and_provenance():
    layers = [
        Layer(Source.ANNOTATION, {"backoff-limit": 1}),
        Layer(Source.NAMESPACE, {"backoff-limit": 2, "non-spot-attempts": 1}, "(ml)"),
        Layer(
            Source.CLUSTER, {"backoff-limit": 3, "non-spot-attempts": 2, "fail-non-retriable": True}
        ),
    ]
    policy = resolve(layers)
    assert policy.backoff_limit == 1
    assert policy.setting("backoff-limit").source is Source.ANNOTATION
    assert policy.non_spot_attempts == 1
    assert policy.setting("non-spot-attempts").describe() == "namespace default (ml)"
    assert policy.fail_non_retriable is True
    assert policy.setting("fail-non-retriable").source is Source.CLUSTER
    assert policy.retriable_exit_codes == (143,)
    assert policy.setting("retriable-exit-codes").source is Source.BUILTIN


def test_none_annotation_overrides_a_default():
    layers = [
        Layer(Source.ANNOTATION, {"error-propagation": None}),
        Layer(Source.CLUSTER, {"error-propagation": "Earliest"}),
    ]
    assert resolve(layers).error_propagation is None


def test_inactive_policy_by_default():
    assert resolve([]).active is False


@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("fail-non-retriable", "true"),
        ("retriable-exit-codes", "137,143"),
        ("backoff-limit", "4"),
        ("error-propagation", "earliest"),
        ("error-propagation", "none"),
    ],
)
def test_format_value_round_trips(key, raw):
    values, _ = parse_annotations({P + key: raw}, Scope.WORKLOAD)
    assert format_value(key, values[key]) == raw
