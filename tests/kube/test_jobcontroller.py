"""The Job controller's rules, written once in ``webhook.kube`` (defaults, the backoff
limit, failed indexes) and stepped by ``FailureCounter``."""

from __future__ import annotations

import pytest

from webhook.kube.defaulting import DEFAULT_BACKOFF_LIMIT, INT32_MAX, default_backoff_limit
from webhook.kube.jobcontroller import (
    BACKOFF_LIMIT_EXCEEDED,
    FAIL_INDEX,
    PAST_PER_INDEX_LIMIT,
    POD_FAILURE_POLICY,
    Ends,
    FailureCounter,
    exceeds_backoff_limit,
    exceeds_max_failed_indexes,
    index_failed,
    past_backoff_limit_on_failure,
)


# upstream: SetDefaults_Job (pkg/apis/batch/v1/defaults.go)
def test_default_backoff_limit_is_6_or_maxint32_with_a_per_index_limit():
    assert DEFAULT_BACKOFF_LIMIT == 6
    assert default_backoff_limit(False) == 6
    assert default_backoff_limit(True) == INT32_MAX == 2**31 - 1


# upstream: syncJob (pkg/controller/job/job_controller.go): failed > *job.Spec.BackoffLimit
@pytest.mark.parametrize(
    ("failed", "limit", "exceeds"), [(0, 0, False), (1, 0, True), (6, 6, False), (7, 6, True)]
)
def test_exceeds_backoff_limit_is_more_counted_failures_than_the_limit(failed, limit, exceeds):
    assert exceeds_backoff_limit(failed, limit) is exceeds


# upstream: pastBackoffLimitOnFailure (pkg/controller/job/job_controller.go)
@pytest.mark.parametrize(
    ("restarts", "limit", "past"),
    [(0, 0, False), (1, 0, True), (2, 3, False), (3, 3, True), (4, 3, True)],
)
def test_past_backoff_limit_on_failure_counts_restarts(restarts, limit, past):
    assert past_backoff_limit_on_failure(restarts, limit) is past


# upstream: isIndexFailed (pkg/controller/job/indexed_job_utils.go)
def test_index_failed_on_fail_index_or_a_counted_failure_at_its_limit():
    assert index_failed("FailIndex", True, 0, 3)
    assert not index_failed("Count", True, 2, 3)
    assert index_failed("Count", True, 3, 3)
    assert index_failed(None, True, 0, 0)
    assert not index_failed("Ignore", False, 5, 3)


# upstream: syncJob (job_controller.go): failedIndexes.total() > *job.Spec.MaxFailedIndexes
def test_exceeds_max_failed_indexes():
    assert not exceeds_max_failed_indexes(5, None)
    assert not exceeds_max_failed_indexes(1, 1)
    assert exceeds_max_failed_indexes(1, 0)


# upstream: syncJob (pkg/controller/job/job_controller.go): a FailJob match first, then
# exceedsBackoffLimit
def test_failure_counter_fails_the_job_past_its_backoff_limit():
    counter = FailureCounter(backoff_limit=1)
    assert counter.step(None, True) == Ends()
    assert counter.step("Ignore", False) == Ends()
    assert counter.step("Count", True) == Ends(job=BACKOFF_LIMIT_EXCEEDED)
    assert (counter.failed, counter.counted()) == (2, 2)


# upstream: syncJob (pkg/controller/job/job_controller.go): getFailJobMessage before
# exceedsBackoffLimit
def test_failure_counter_fails_the_job_on_a_fail_job_match_first():
    counter = FailureCounter(backoff_limit=0)
    assert counter.step("FailJob", True) == Ends(job=POD_FAILURE_POLICY)


# upstream: isIndexFailed (pkg/controller/job/indexed_job_utils.go)
def test_failure_counter_counts_each_index_against_its_per_index_limit():
    counter = FailureCounter(backoff_limit=INT32_MAX, per_index=1)
    assert counter.step(None, True, 0) == Ends()
    assert counter.step(None, True, 1) == Ends()
    assert counter.step("Ignore", False, 0) == Ends()
    assert counter.step(None, True, 0) == Ends(index=PAST_PER_INDEX_LIMIT)
    assert counter.step("FailIndex", True, 1) == Ends(index=FAIL_INDEX)
    assert (counter.failed, counter.counted(0), counter.counted(1)) == (4, 2, 2)
