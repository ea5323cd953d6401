"""What the user wrote: the quick "never named" answer agrees with parsing the record."""

from __future__ import annotations

import json

import pytest

from testkit.builders import job
from webhook.kube.intent import LAST_APPLIED, user_wrote


def with_record(text: str) -> dict:
    obj = job()
    obj["metadata"]["annotations"] = {LAST_APPLIED: text}
    return obj


@pytest.mark.parametrize(
    ("record", "wrote"),
    [
        ({"spec": {"backoffLimit": 6}}, True),
        ({"spec": {"template": {}}}, False),
        ({"metadata": {"labels": {"backoffLimit": "x"}}, "spec": {}}, False),  # named elsewhere
        ({"spec": {"parallelism": 2}, "note": "a \\ backslash"}, False),
    ],
)
def test_written_or_not(record, wrote):
    assert user_wrote(with_record(json.dumps(record)), ("spec", "backoffLimit")) is wrote


def test_a_key_spelled_with_escapes_is_still_found():
    text = '{"spec": {"backoff\\u004cimit": 6}}'
    assert json.loads(text) == {"spec": {"backoffLimit": 6}}
    assert user_wrote(with_record(text), ("spec", "backoffLimit")) is True


def test_a_record_that_is_not_an_object_is_not_trusted():
    assert user_wrote(with_record("[1, 2]"), ("spec", "backoffLimit")) is None
    assert user_wrote(with_record("not json"), ("spec", "backoffLimit")) is None
