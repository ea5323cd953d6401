"""One review by hand: ``retry-webhook dry-run -o review`` prints the AdmissionReview the API
server would send for a manifest, and the README's ``curl`` line posts it to a running
server. Posted to the real server (testkit/servers.py), it is answered with the very
patch ``dry-run -o patch`` shows."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from testkit.builders import SYSTEM_FIELDS, apply, decode_patch
from testkit.servers import start, stop
from testkit.tools import ROOT

BIN = Path(sys.executable).parent / "retry-webhook"
EXAMPLE = "examples/job.yaml"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("certs"))
    yield srv
    stop(srv)


def dry_run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN), "dry-run", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def reviews(text: str) -> list[dict]:
    """The JSON documents printed one after another."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        value, at = decoder.raw_decode(text, at)
        found.append(value)
        at += len(text[at:]) - len(text[at:].lstrip())
    return found


def test_the_review_is_shaped_as_the_api_server_sends_a_create():
    done = dry_run("-f", EXAMPLE, "-o", "review")
    assert done.returncode == 0, done.stderr
    (printed,) = reviews(done.stdout)
    assert (printed["apiVersion"], printed["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    request = printed["request"]
    uuid.UUID(request["uid"])
    # upstream: CreateV1AdmissionReview (k8s.io/apiserver
    # pkg/admission/plugin/webhook/request/admissionreview.go): kind and resource as the
    # rule matched them, requestKind and requestResource as the client asked.
    gvk = {"group": "batch", "version": "v1", "kind": "Job"}
    gvr = {"group": "batch", "version": "v1", "resource": "jobs"}
    assert (request["kind"], request["requestKind"]) == (gvk, gvk)
    assert (request["resource"], request["requestResource"]) == (gvr, gvr)
    assert (request["name"], request["namespace"]) == ("train-resnet", "ml")
    assert (request["operation"], request["dryRun"], request["oldObject"]) == (
        "CREATE",
        False,
        None,
    )
    assert (
        request["userInfo"]["username"]
        and "system:authenticated" in (request["userInfo"]["groups"])
    )
    assert request["options"]["kind"] == "CreateOptions"
    meta = request["object"]["metadata"]
    assert not SYSTEM_FIELDS & set(meta)
    # As kubectl apply creates it: the manifest recorded, the API's defaults applied.
    assert "kubectl.kubernetes.io/last-applied-configuration" in meta["annotations"]
    assert request["object"]["spec"]["backoffLimit"] == 6


def test_system_fields_a_create_wipes_are_not_in_the_review():
    """A manifest exported from a cluster (uid, resourceVersion, creationTimestamp) and a
    controller's pod (generateName, no name) as a create hands them over."""
    manifest = (
        "apiVersion: v1\nkind: Pod\nmetadata:\n  generateName: train-\n  namespace: ml\n"
        "  uid: 0a1b\n  resourceVersion: '42'\n  creationTimestamp: '2026-11-22T00:00:00Z'\n"
        "spec:\n  restartPolicy: Never\n  containers: [{name: main, image: busybox:1.36}]\n"
    )
    done = dry_run("-f", "-", "-o", "review", stdin=manifest)
    assert done.returncode == 0, done.stderr
    (printed,) = reviews(done.stdout)
    request = printed["request"]
    assert not SYSTEM_FIELDS & set(request["object"]["metadata"])
    # upstream: AdmissionRequest.Name (k8s.io/api admission/v1): empty, so left out, when
    # the server generates the name.
    assert "name" not in request
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}


def test_every_object_gets_a_review_of_its_own():
    done = dry_run("-f", EXAMPLE, "-f", "examples/cronjob.yaml", "-o", "review")
    printed = reviews(done.stdout)
    assert [r["request"]["kind"]["kind"] for r in printed] == ["Job", "CronJob"]
    assert len({r["request"]["uid"] for r in printed}) == 2


def test_the_server_answers_the_printed_review_with_dry_runs_patch(server):
    printed = reviews(dry_run("-f", EXAMPLE, "-o", "review").stdout)[0]
    (expected,) = json.loads(dry_run("-f", EXAMPLE, "-o", "patch").stdout)
    answer = server.review("/mutate", printed)["response"]
    assert answer["uid"] == printed["request"]["uid"]
    assert answer["allowed"] is True
    patch = decode_patch({"response": answer})
    assert patch == expected["patch"]
    admitted = apply(printed["request"]["object"], patch)
    assert admitted["spec"]["backoffLimit"] == 3
    assert [r["action"] for r in admitted["spec"]["podFailurePolicy"]["rules"]] == [
        "Ignore",
        "FailJob",
    ]


def readme_curl_line() -> str:
    """The README's command that sends one review to ``make run``."""
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if "| curl" in line]
    (line,) = [line for line in lines if "-o review" in line and "/mutate" in line]
    return line.strip()


def test_the_readmes_curl_line_posts_the_review_to_make_run(server):
    line = readme_curl_line()
    # What `make run` serves: 127.0.0.1:8443 with the dev CA in certs/.
    assert "https://127.0.0.1:8443/mutate" in line and "--cacert certs/ca.crt" in line
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    command = (
        line.replace(".venv/bin/retry-webhook", str(BIN))
        .replace("certs/ca.crt", str(server.cert_dir / "ca.crt"))
        .replace("127.0.0.1:8443", f"127.0.0.1:{server.port}")
    )
    command = re.sub(r"(^|\s)curl\s", rf"\1{curl} ", command)
    done = subprocess.run(
        ["/bin/sh", "-c", command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    (expected,) = json.loads(dry_run("-f", EXAMPLE, "-o", "patch").stdout)
    assert answer["response"]["allowed"] is True
    assert decode_patch(answer) == expected["patch"]
