"""Every policy key's bad values, in one table: each is denied naming the annotation, the
value, and what would be accepted (the grammars: ``webhook.policy.grammar``; the keys:
``webhook.policy.model.KEYS``). A key added without a row here fails
``test_every_key_a_user_writes_has_a_row``."""

from __future__ import annotations

import pytest

from testkit.builders import P, job, pod
from testkit.workloads import validate
from webhook.policy.model import KEYS

#: (key, bad value, what the denial must say is accepted), for the keys a workload takes.
WORKLOAD = [
    ("fail-non-retriable", "yes", "true or false"),
    ("fail-non-retriable", "True", "true or false"),
    ("fail-non-retriable", "", "true or false"),
    ("retriable-exit-codes", "0", "exit codes from 1 to 255"),
    ("retriable-exit-codes", "256", "exit codes from 1 to 255"),
    ("retriable-exit-codes", "143,", "exit codes from 1 to 255"),
    ("retriable-exit-codes", "", "exit codes from 1 to 255"),
    ("retriable-exit-codes", "sigterm", "exit codes from 1 to 255"),
    ("on-non-retriable", "fail-pod", "fail-job, or fail-index"),
    ("backoff-limit", "-1", "a whole number from 0 to 2147483647"),
    ("backoff-limit", "3.0", "a whole number from 0 to 2147483647"),
    ("backoff-limit", " 3", "a whole number from 0 to 2147483647"),
    ("backoff-limit", "1e3", "a whole number from 0 to 2147483647"),
    ("backoff-limit", "2147483648", "a whole number from 0 to 2147483647"),
    ("backoff-limit", "٣", "a whole number from 0 to 2147483647"),  # int() would take it
    ("ignore-disruptions", "maybe", "true or false"),
    ("max-disruptions", "-1", "a whole number from 0 to 2147483647"),
    ("max-disruptions", "two", "a whole number from 0 to 2147483647"),
    ("peer-disruptions", "yes", "ignore (a disrupted pod's peers fail free), count"),
    ("non-spot-attempts", "many", "a whole number from 0 to 2147483647"),
    ("error-propagation", "latest", "earliest"),
    ("error-propagation", "Earliest", "earliest"),
    ("oom-memory-factor", "1", "a decimal number above 1"),
    ("oom-memory-factor", "0.5", "a decimal number above 1"),
    ("oom-memory-factor", "lots", "a decimal number above 1"),
    ("oom-memory-factor", "1.2345", "at most 3 decimal places"),
    ("oom-memory-limit", "8GB", "a memory quantity above 0"),
    ("oom-memory-limit", "0", "a memory quantity above 0"),
    ("oom-memory-limit", "-1Gi", "a memory quantity above 0"),
    ("avoid-failed-nodes", "yes", "true or false"),
    ("in-place-exit-codes", "0", "0 is success"),
    ("in-place-exit-codes", "42,0", "0 is success"),
    ("in-place-exit-codes", "256", "exit codes from 1 to 255"),
    ("in-place-exit-codes", "forty-two", "exit codes from 1 to 255"),
    ("in-place-exit-codes", "", "exit codes from 1 to 255"),
    ("in-place-scope", "node", "container (the container that exited) or pod"),
    ("attempt-env", "on", "true or false"),
    ("retry-delay", "5 minutes", "a duration from 1s to 168h"),
    ("retry-delay-factor", "0.5", "a decimal number of at least 1"),
    ("retry-delay-max", "forever", "a duration from 1s to 168h"),
    ("max-in-place-restarts", "0", "a whole number from 1 to 2147483647"),
    ("max-in-place-restarts", "1.5", "a whole number from 1 to 2147483647"),
    ("free-categories", "lower-case!", "a comma-separated list of category names"),
    ("max-free-failures", "-2", "a whole number from 0 to 2147483647"),
    ("fail-categories", "lower-case!", "a comma-separated list of category names"),
    ("start-deadline", "5s", "from 10s to 168h"),
    ("start-deadline", "soon", "15m"),
]

#: The same, for the keys only a Pod takes.
POD = [
    ("attempt", "first", "a whole number"),
    ("not-before", "tomorrow", "RFC 3339"),
]

#: Keys nobody writes by hand: the webhook's own records on the object, and
#: ``jobset-uid``, which earlier versions wrote and is read as anything (ignored).
RECORDS = {"applied", "audit", "history", "defaults", "jobset-uid"}


def _denial(verdict, key: str) -> str:
    """The denial's message, once its one problem for ``key`` is a bad value."""
    assert not verdict.allowed, key
    (problem,) = [p for p in verdict.problems if p.where == f"annotation {P}{key}"]
    assert problem.reason == "bad-value"
    return verdict.message


@pytest.mark.parametrize(("key", "value", "accepted"), WORKLOAD)
def test_a_bad_value_is_denied_with_the_key_the_value_and_what_is_accepted(key, value, accepted):
    message = _denial(validate(job({P + key: value})), key)
    assert f"annotation {P}{key}: {value!r} is not valid" in message
    assert "accepted: " in message and accepted in message


@pytest.mark.parametrize(("key", "value", "accepted"), POD)
def test_a_bad_pod_value_is_denied_with_the_key_the_value_and_what_is_accepted(
    key, value, accepted
):
    message = _denial(validate(pod({P + key: value})), key)
    assert f"annotation {P}{key}: {value!r} is not valid" in message
    assert accepted in message


def test_every_key_a_user_writes_has_a_row():
    rows = {key for key, _, _ in WORKLOAD + POD}
    assert rows == set(KEYS) - RECORDS
