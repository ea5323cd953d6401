"""``status``'s plan rebuilt from the stored object and its applied record (issue 40):
the object is what the webhook wrote, and its record (version 2) says which settings were
applied and which rules are the webhook's, so nothing is admitted again; a version-1
record (written before the rules' origins were recorded) still falls back to admitting
the object again, through the ``readmit`` the layer above gives (``webhook.cli.status``).
"""

from __future__ import annotations

import uuid

import pytest
import yaml

from testkit.builders import P, v1_of
from testkit.clusters import (
    NS,
    POLICY,
    T0,
    admit,
    at_minute,
    controller_pod,
    failed,
    job_manifest,
    tree,
)
from testkit.tools import ROOT
from webhook.admission import engine
from webhook.cli.status import readmit
from webhook.plan.record import AppliedRecord
from webhook.policy.config import Config, parse_config
from webhook.status.reader import KINDS, Tree
from webhook.status.story import tell

#: The admins' defaults at the Job's admission.
ADMITTED_WITH = "defaults: {ignore-disruptions: 'true', backoff-limit: '2'}"
#: The admins' defaults now: admitted again today, the Job would get a FailJob rule and a
#: budget of 5.
NOW = "defaults: {fail-non-retriable: 'true', backoff-limit: '5'}"


def _job(
    annotations: dict[str, str], config_text: str | None = None, config: Config | None = None
) -> dict:
    config = config if config is not None else parse_config(config_text or "{}")
    job = admit(job_manifest("train", annotations), config=config)
    job["status"] = {"startTime": T0, "active": 1, "failed": 1}
    return job


def _no_admission(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any admission from here on fails the test."""

    def admitted(*args, **kwargs):
        raise AssertionError("status admitted an object")

    for name in ("review", "review_object", "mutate", "validate"):
        monkeypatch.setattr(engine, name, admitted)


def _told(plan) -> tuple[dict, list]:
    settings = {s.name: (s.value, s.source) for s in plan.settings}
    return settings, [(r.action, r.origin) for r in plan.rules]


def test_a_versioned_record_is_told_without_admitting_anything(monkeypatch):
    job = _job(POLICY)
    assert AppliedRecord.of(job).version >= 2
    oom = failed(
        controller_pod(job, 0, at_minute(0)), "node-a", "trainer", 137, at_minute(5), oom=True
    )
    oom["metadata"]["uid"] = str(uuid.uuid4())
    _no_admission(monkeypatch)
    story = tell(tree(job, [oom]), readmit=lambda *args: pytest.fail("readmitted"))
    (plan,) = story.explained
    settings, rules = _told(plan)
    assert settings["backoff-limit"] == ("3", "annotation")
    assert rules == [
        ("Ignore", "added by retry-policy for ignore-disruptions"),
        ("FailJob", "added by retry-policy for fail-non-retriable"),
    ]
    assert not any("would change it" in n or "cannot tell" in n for n in story.notes)
    # The next attempt, from the failures read and the pod's own planner: attempt 2 of 4,
    # the last 3 on non-spot nodes, more memory after the OOM kill, off node-a.
    nxt = story.jobs[0].next
    assert (nxt.attempt, nxt.attempts, nxt.non_spot) == (2, 4, True)
    assert [(m.container, m.kind, m.before, m.after) for m in nxt.memory] == [
        ("trainer", "request", "2Gi", "3Gi"),
        ("trainer", "limit", "2Gi", "3Gi"),
    ]
    assert nxt.avoided_nodes == ["node-a"]


def test_the_story_holds_when_the_config_given_now_would_change_the_object(monkeypatch):
    job = _job({}, ADMITTED_WITH)
    now = parse_config(NOW)
    _no_admission(monkeypatch)
    story = tell(tree(job), now)
    (plan,) = story.explained
    settings, rules = _told(plan)
    # What was applied, as the record says, with the file saying which layer gave it.
    assert settings["backoff-limit"] == ("2", "cluster default")
    assert settings["ignore-disruptions"] == ("true", "cluster default")
    assert settings.get("fail-non-retriable", ("false",))[0] == "false"
    assert rules == [("Ignore", "added by retry-policy for ignore-disruptions")]
    assert plan.changes == []
    assert story.notes == []


def test_a_version_1_record_falls_back_to_admitting_the_object_again():
    job = _job({}, ADMITTED_WITH)
    now = parse_config(NOW)
    asked = []

    def counted(obj, config, namespace):
        asked.append(obj["metadata"]["name"])
        return readmit(obj, config, namespace)

    old = tell(tree(v1_of(job)), now, readmit=counted)
    assert asked, "a version-1 record's plan is found by admitting the object again"
    # Admitted again with the defaults of today, the Job would change: the fallback says
    # so and reads the stored spec without its settings (what it did before the record
    # kept the rules' origins).
    assert any("would change it" in n for n in old.notes)
    # Judged with what it was admitted with, it finds the webhook's rule as before.
    (plan,) = tell(tree(v1_of(job)), readmit=counted).explained
    assert _told(plan)[1] == [("Ignore", "added by retry-policy for ignore-disruptions")]


def test_without_readmit_a_version_1_record_is_told_by_the_rules_shape(monkeypatch):
    job = v1_of(_job(POLICY))
    assert AppliedRecord.of(job).version == 1
    _no_admission(monkeypatch)
    (plan,) = tell(tree(job)).explained
    assert _told(plan)[1] == [
        ("Ignore", "added by retry-policy for ignore-disruptions"),
        ("FailJob", "added by retry-policy for fail-non-retriable"),
    ]


def test_the_rules_the_record_names_are_the_webhooks_and_no_others(monkeypatch):
    """A user's rule equal in shape to none of ours stays the user's: origins are by id."""
    manifest = job_manifest("train", {P + "ignore-disruptions": "true"})
    mine = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}
    manifest["spec"]["podFailurePolicy"] = {"rules": [mine]}
    job = admit(manifest)
    _no_admission(monkeypatch)
    (plan,) = tell(tree(job)).explained
    assert _told(plan)[1] == [
        ("FailJob", "your rule"),
        ("Ignore", "added by retry-policy for ignore-disruptions"),
    ]


def test_an_admins_file_says_which_layer_gave_each_recorded_setting(monkeypatch):
    config = parse_config(
        "defaults: {backoff-limit: '2'}\n"
        f"namespaces:\n  {NS}:\n    defaults: {{ignore-disruptions: 'true'}}\n"
    )
    job = _job({}, config_text=None, config=config)
    _no_admission(monkeypatch)
    (plan,) = tell(tree(job), config).explained
    settings = _told(plan)[0]
    assert settings["backoff-limit"] == ("2", "cluster default")
    assert settings["ignore-disruptions"] == ("true", "namespace default")
    # Without the file, a user cannot tell the layers apart: both are the admins'.
    (plan,) = tell(tree(job)).explained
    assert _told(plan)[0]["ignore-disruptions"] == ("true", "cluster default")


def test_a_jobsets_own_rule_and_its_childrens_are_told_without_admission(monkeypatch):
    manifest = yaml.safe_load((ROOT / "examples" / "jobset.yaml").read_text())
    jobset = admit(manifest)
    kind = next(k for k in KINDS if k.kind == "JobSet")
    _no_admission(monkeypatch)
    overview, *children = tell(Tree(kind, jobset)).explained
    assert [r.origin for r in overview.rules] == [
        "added by retry-policy for peer-disruptions (retryPolicyPeerDisruptions)",
        "your rule failOnDeadline",
        "added by retry-policy for fail-non-retriable (retryPolicyFailNonRetriable)",
    ]
    for child in children:
        assert {r.origin for r in child.rules} <= {
            f"added by retry-policy for {name}"
            for name in (
                "fail-non-retriable",
                "ignore-disruptions",
                "max-disruptions",
                "peer-disruptions",
            )
        }
        assert "set by retry-policy: backoff-limit counts runs of the JobSet" in child.budget
