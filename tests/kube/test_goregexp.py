"""Go regexp (RE2) patterns searched in messages with unknown parts (``webhook.kube.goregexp``),
as JobSet searches ``onJobFailureMessagePatterns`` in a failed Job's message.

# upstream: anyMatchFound (regexp.MatchString; a pattern that does not compile is logged
# and skipped) in kubernetes-sigs/jobset pkg/controllers/failure_policy.go
"""

from __future__ import annotations

import re

import pytest

from webhook.kube.goregexp import DNS_CHARS, Unsupported, Wild, compile_go

MESSAGE = (
    "Container main for pod ml/js-w-0-0-x7k2p failed with exit code 1 matching FailJob rule "
    "at index 1"
)
#: The same message with the pod's name unknown and any exit code but 143.
CODES = tuple(str(c) for c in range(1, 256) if c != 143)
SHAPE = [
    "Container ",
    ("main", "sidecar"),
    " for pod ml/",
    Wild(),
    " failed with exit code ",
    CODES,
    " matching FailJob rule at index 1",
]


@pytest.mark.parametrize(
    "pattern",
    [
        ".*",
        "",
        "exit code 1\\b",
        "exit code 1$",
        "^Container",
        "index 1$",
        "(?i)CONTAINER MAIN",
        "code (1|2) ",
        "code [^0-9]",
        "\\bpod\\b",
        "x{2}",
        "^$",
        "[a-c]+z",
        "\\d{3}",
        "rule at index [0-9]+$",
        "t\\B",
        "(?:ab)*?c",
        "a|b",
        "\\.",
        "[]a]",
        "(?s:.)",
    ],
)
def test_a_known_message_is_matched_as_re_searches_it(pattern):
    # On ASCII text without line breaks, Python's re.search and Go's MatchString agree on
    # every pattern compile_go accepts.
    assert compile_go(pattern).search([MESSAGE]) == (re.search(pattern, MESSAGE) is not None)


@pytest.mark.parametrize(
    ("pattern", "matches"),
    [
        (".*", True),
        ("exit code 1 ", True),
        ("exit code 143 ", False),  # the retriable code never fails the Job
        ("exit code 1$", False),
        ("^Container sidecar ", True),
        ("^Container trainer ", False),
        ("for pod ml/js-w-1-", True),  # some pod of the set may be named so
        ("for pod other/", False),
        ("pod ml/[A-Z]", False),  # pod names are lower case
        ("index 0$", False),
        ("index 1$", True),
    ],
)
def test_a_message_with_unknown_parts_matches_when_some_message_does(pattern, matches):
    assert compile_go(pattern).search(SHAPE) is matches


def test_an_unknown_run_matches_what_a_pod_name_could_hold():
    program = compile_go("pod ml/[a-z0-9.-]+ failed")
    assert program.search(SHAPE)
    assert not compile_go("pod ml/ failed").search(SHAPE)  # a name is never empty
    assert compile_go("code\\b").search(["x", Wild(frozenset("-")), "y"]) is False
    assert compile_go("-\\by").search(["x", Wild(DNS_CHARS), "y"])


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("[[:alpha:]]+", "POSIX"),
        ("\\pL", "\\p"),
        ("\\Qa.b\\E", "\\Q"),
        ("a(?=b)", "assert"),
        ("(a)\\1", "\\1"),
        ("end\\Z", "\\Z"),
        ("end\\z", "\\z"),
        ("a*+", "possessive"),
        ("(?x) a", "flag"),
        ("x{,3}", "{,n}"),
        ("a{1001}", "1000"),
        ("(?#note)a", "comments"),
        ("[\\b]", "\\b"),
        ("(?<name>a)", "not read alike"),
        ("(", "not read alike"),
    ],
)
def test_what_go_and_python_read_differently_is_refused_with_the_reason(pattern, why):
    with pytest.raises(Unsupported, match=re.escape(why)):
        compile_go(pattern)


def test_matches_everything_only_without_assertions():
    assert compile_go(".*").matches_everything()
    assert compile_go("").matches_everything()
    assert compile_go("(x|)").matches_everything()
    assert not compile_go("^.*").matches_everything()
    assert not compile_go("exit").matches_everything()
