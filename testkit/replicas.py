"""Replicas of the server as deployed, each with its controller, electing a leader on a Lease
of the HTTP test API; and the elector alone, with the real ``kubernetes`` client.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kubernetes import client, config

from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.servers import start
from webhook.controller.lease import LeaderElector, LeaseConfig

NS = "retry-policy-system"
FAST = {"lease_seconds": 1.5, "renew_deadline": 1.0, "retry_period": 0.1}
#: For a leader that must keep leading through a test on a busy machine (a renewal that
#: takes over a second under load loses a FAST lease): what the test checks is its work.
STEADY = {"lease_seconds": 12.0, "renew_deadline": 8.0, "retry_period": 0.2}


def coordination(fake: FakeAPI, tmp_path: Path) -> client.CoordinationV1Api:
    path = write_kubeconfig(tmp_path / f"kubeconfig-{time.monotonic_ns()}", fake.url)
    return client.CoordinationV1Api(config.new_client_from_config(str(path)))


def elector(fake, tmp_path, identity, **kw) -> LeaderElector:
    cfg = LeaseConfig(NS, "retry-policy-webhook-controller", identity, **{**FAST, **kw})
    return LeaderElector(coordination(fake, tmp_path), cfg)


def lease(fake: FakeAPI) -> dict:
    found = fake.get("leases", "retry-policy-webhook-controller", NS)
    assert found is not None
    return found


def readyz(server) -> dict:
    status, _, raw = server.request("GET", "/readyz")
    assert status == 200, raw
    return json.loads(raw)["controller"]


def replica(tmp_path, fake, name, *extra):
    kubeconfig = write_kubeconfig(tmp_path / f"kubeconfig-{name}", fake.url)
    certs = tmp_path / "certs"
    return start(
        certs,
        "--kube",
        "kubeconfig",
        "--lease-namespace",
        NS,
        "--lease-duration",
        "2",
        "--renew-deadline",
        "1.5",
        "--retry-period",
        "0.2",
        *extra,
        log_path=tmp_path / f"{name}.log",
        env={"KUBECONFIG": str(kubeconfig), "POD_NAME": name},
        preexec_fn=os.setsid,  # a group of its own: killed whole below
    )
