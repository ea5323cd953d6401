"""``retry-webhook status -f FILE`` (webhook/status/recorded.py): the story told from what
``kubectl get jobs,pods,events -o yaml`` recorded, without a cluster, the way a user tries
``status`` first (docs/STATUS.md) or attaches a story to a bug report.

The recording is made from a cluster the test suite builds as its controllers build it
(testkit/clusters.py: the webhook's own admission, the Job controller's pods, the
kubelet's failures, the webhook's EventRecorder), and the story told from the file must be
the one told live from the same cluster. Events are recorded as ``kubectl get events``
prints them, core v1, which the API server converts to events.k8s.io/v1 for a live read.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.clusters import BIN, NS, client_for, emit, run, running_job
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.tools import ROOT

EXAMPLE = "examples/status/train-resnet.yaml"


def status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "retry-webhook"), "status", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def core_v1(event: dict[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event as ``kubectl get events`` (core v1) prints it.
    upstream: Convert_v1_Event_To_core_Event (pkg/apis/events/v1/conversion.go): regarding
    is involvedObject, note is message, the deprecated fields drop their prefix; the core
    JSON name of reportingController is reportingComponent."""
    out = {k: v for k, v in event.items() if k not in ("regarding", "note", "series")}
    out.update(
        apiVersion="v1",
        involvedObject=event["regarding"],
        message=event.get("note"),
        reportingComponent=event.pop("reportingController", None),
        count=event.get("deprecatedCount"),
        firstTimestamp=event.get("deprecatedFirstTimestamp"),
        lastTimestamp=event.get("deprecatedLastTimestamp"),
    )
    for key in ("reportingController", "deprecatedCount"):
        out.pop(key, None)
    if event.get("series"):
        out["series"] = event["series"]
    return out


def record(api: Any, path: Path) -> Path:
    """What ``kubectl get jobs,pods,events -n ml -o yaml`` prints for the fake cluster."""
    jobs = [copy.deepcopy(o) for o in api.objects["jobs"].values()]
    pods = [copy.deepcopy(o) for o in api.objects["pods"].values()]
    events = [core_v1(copy.deepcopy(o)) for o in api.named["events"].values()]
    items = [*jobs, *pods, *events]
    listed = {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}
    path.write_text(yaml.safe_dump(listed, sort_keys=False))
    return path


@pytest.fixture
def cluster(tmp_path):
    api = FakeAPI().start()
    yield api, write_kubeconfig(tmp_path / "kubeconfig", api.url)
    api.stop()


def test_the_story_from_a_recording_is_the_live_one(cluster, tmp_path):
    api, kubeconfig = cluster
    job, _ = running_job(api)
    emit(client_for(api.url), "Job", job, "RetryMemoryIncreased", "trainer: memory 2Gi -> 3Gi")
    emit(client_for(api.url), "Job", job, "RetryMemoryIncreased", "trainer: memory 2Gi -> 3Gi")
    live = run(kubeconfig, "job/train", "-n", NS, "-o", "json")
    assert live.returncode == 0, live.stderr
    recorded = record(api, tmp_path / "recorded.yaml")
    api.stop()  # no cluster from here on (stopping twice is harmless)
    told = status("job/train", "-f", str(recorded), "-o", "json")
    assert told.returncode == 0, told.stderr
    from_file, from_cluster = json.loads(told.stdout), json.loads(live.stdout)
    # What differs is only what a file cannot tell: Nodes the recording lacks (so failed
    # nodes are avoided by preference, as when a user may not list them), and that note.
    (nxt,) = [j["next"] for j in from_file["jobs"]]
    assert nxt["avoidedBy"] == "preference"
    assert any(
        "Nodes: none in" in note for note in from_file["jobs"][0]["notes"] + from_file["notes"]
    )
    for story in (from_file, from_cluster):
        story["jobs"][0]["next"].pop("avoidedBy")
        story["jobs"][0]["next"].pop("changes")
        story["jobs"][0].pop("notes")
        story.pop("notes")
    assert from_file == from_cluster
    (event,) = from_file["events"]
    assert (event["reason"], event["count"]) == ("RetryMemoryIncreased", 2)


def test_the_shipped_recording_tells_its_story_without_a_cluster():
    """The command docs/STATUS.md gives to try ``status`` locally."""
    command = f"retry-webhook status job/train-resnet -f {EXAMPLE}"
    assert command in (ROOT / "docs" / "STATUS.md").read_text()
    done = status("job/train-resnet", "-f", EXAMPLE)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("Job ml/train-resnet: Running\n")  # its namespace, from the file
    flat = " ".join(text.split())
    assert "backoffLimit 3: 3 counted failures, 0 retries left" in flat
    assert "disrupted (PreemptionByScheduler; trainer exited 143); not counted: rule 1" in flat
    assert "OOM-killed (container trainer, exit code 137); counted (no rule matches)" in flat
    assert "Running on od-1 (attempt 4 of 4, non-spot)" in flat
    assert "Normal RetryOnNonSpot on Job/train-resnet" in flat
    story = json.loads(status("job/train-resnet", "-f", EXAMPLE, "-o", "json").stdout)
    assert [a["counted"] for a in story["jobs"][0]["attempts"]] == [False, True, True, True, None]


def test_what_a_recording_lacks_is_said_as_the_api_would_say_it(tmp_path):
    recording = tmp_path / "empty.yaml"
    recording.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    missing = status("job/train", "-f", str(recording), "-n", NS)
    assert missing.returncode == 2
    assert missing.stderr.startswith(f"Error: Job {NS}/train not found")
    unreadable = status("job/train", "-f", str(tmp_path / "nothing.yaml"))
    assert unreadable.returncode == 2
    assert f"cannot read {tmp_path / 'nothing.yaml'}" in unreadable.stderr
    assert "Traceback" not in missing.stderr + unreadable.stderr
