"""Our output against real Kubernetes parts: Go's json-patch (through ``kubectl patch
--local``, the library the API server uses) and the official JSON schemas (strict)."""

from __future__ import annotations

import json
import subprocess

import kubernetes_validate
import pytest

from testkit.builders import FULL, P, apply, job, job_owner, pod, review
from testkit.servers import scaled
from testkit.tools import tool
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.cluster.facts import NoCluster
from webhook.policy.config import Config, parse_config


class Attempts(NoCluster):
    def job_failures(self, namespace, name, uid):
        from webhook.cluster.attempts import AttemptLookup

        return AttemptLookup(3, "test")

    def stats(self):
        return {}


def _with_odd_keys(obj):
    # Keys with "/" and "~" must be escaped as ~1 and ~0 in JSON pointers.
    obj["metadata"].setdefault("annotations", {})["odd~key/with~1slash"] = "kept"
    return obj


def scenarios():
    user_rules = {
        "podFailurePolicy": {
            "rules": [{"action": "Count", "onExitCodes": {"operator": "In", "values": [3]}}]
        }
    }
    affinity = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
                    ]
                }
            }
        }
    }
    yield "job-full", _with_odd_keys(job(FULL)), Config()
    yield "job-full-applied", job(FULL, applied=True), Config()
    yield "job-user-rules", job(FULL, spec=user_rules), Config()
    yield (
        "job-no-annotations-defaults",
        job(),
        parse_config("defaults: {fail-non-retriable: true, backoff-limit: 2}"),
    )
    yield (
        "job-template-metadata-exists",
        job(FULL, template_annotations={"other.io/x": "y"}),
        Config(),
    )
    yield (
        "pod-last-attempt",
        _with_odd_keys(
            pod({P + "backoff-limit": "3", P + "non-spot-attempts": "1"}, owner=job_owner())
        ),
        Config(),
    )
    yield (
        "pod-with-affinity",
        pod(
            {
                P + "backoff-limit": "3",
                P + "non-spot-attempts": "2",
                P + "error-propagation": "earliest",
            },
            owner=job_owner(),
            spec=affinity,
        ),
        Config(),
    )


SCENARIOS = list(scenarios())


@pytest.mark.parametrize(("name", "obj", "config"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_patch_applies_with_go_json_patch_and_result_is_schema_valid(name, obj, config, tmp_path):
    kubectl = tool("kubectl")
    request = admission.decode(json.dumps(review(obj)))
    verdict = engine.mutate(request, config, Attempts())
    assert verdict.allowed, verdict.message
    assert verdict.patch, "every scenario changes something"
    expected = apply(obj, verdict.patch)
    source = tmp_path / "obj.json"
    source.write_text(json.dumps(obj))
    result = subprocess.run(
        [
            kubectl,
            "patch",
            "--local",
            "-f",
            str(source),
            "--type",
            "json",
            "-p",
            json.dumps(verdict.patch),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=scaled(60),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expected
    for version in ("1.33", "1.37"):
        kubernetes_validate.validate(expected, version, strict=True)


def test_patch_escapes_slash_and_tilde_in_pointers():
    obj = _with_odd_keys(job(FULL))
    request = admission.decode(json.dumps(review(obj)))
    paths = [op["path"] for op in engine.mutate(request, Config()).patch]
    assert "/metadata/annotations/retry-policy.dev~1applied" in paths


def test_schema_validation_would_catch_a_bad_field():
    # Guard against a validator that accepts everything: strict mode must reject this.
    obj = job(FULL)
    obj["spec"]["podFailurePolicy"] = {"rules": [{"action": "FailJob", "onExitCode": {}}]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, "1.37", strict=True)
