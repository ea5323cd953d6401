"""``make cluster`` and ``make cluster-down``: the real control plane on 127.0.0.1 with our
webhook and controller served beside it (docs/CLUSTER.md).

    python -m testkit.controlplane up      # build if needed, start, print how to use it
    python -m testkit.controlplane down    # stop everything it started
    python -m testkit.controlplane status  # what runs
"""

from __future__ import annotations

import argparse
import shutil
import ssl
import sys
import time
from pathlib import Path

from testkit.controlplane import components as cp
from testkit.controlplane.cluster import DEFAULT_PORTS, ROOT, Cluster
from testkit.controlplane.webhook import Release

DIRECTORY = ROOT / ".cluster"
WEBHOOK_PORT = 8443
METRICS_PORT = 9091


def up(directory: Path) -> int:
    state = directory / "state.json"
    if state.exists():
        running = Cluster.load(directory)
        if running.pids and not running.dead():
            print(
                f"The cluster already runs (make cluster-down stops it): {directory / 'kubeconfig'}"
            )
            return 0
        running.down()
    began = time.monotonic()
    load = " ".join(f"{x:.2f}" for x in __import__("os").getloadavg())
    cluster = Cluster(directory, DEFAULT_PORTS)
    cluster.up()
    try:
        release = Release(cluster, WEBHOOK_PORT)
        release.install()
        serve = ROOT / ".venv" / "bin" / "retry-webhook"
        argv = [str(serve), "serve", *release.serve_args(METRICS_PORT)]
        proc = cp.spawn(argv, cluster.log("retry-webhook"), env=release.serve_env("make-cluster"))
        cluster.pids["retry-webhook"] = proc.pid
        cluster.save()
        context = ssl.create_default_context(cafile=str(release.cert_dir / "ca.crt"))
        cp.wait_http(
            f"{release.url}/readyz",
            time.monotonic() + 60,
            "retry-webhook serve",
            proc,
            cluster.log("retry-webhook"),
            context,
        )
    except BaseException:
        cluster.down()
        raise
    shutil.copyfile(cluster.kubeconfig, directory / "kubeconfig")
    took = time.monotonic() - began
    print(
        f"A real control plane (Kubernetes v1.37.2) runs on 127.0.0.1, up in {took:.1f} s "
        f"(load average before: {load}).\n"
        f"  API server        {cluster.server}\n"
        f"  our webhook       {release.url} (metrics: http://127.0.0.1:{METRICS_PORT}/metrics)\n"
        f"  nodes             {', '.join(n.name for n in cluster.nodes)}\n"
        f"  logs              {directory / 'logs'}\n\n"
        f"Try it:\n"
        f"  export KUBECONFIG={directory / 'kubeconfig'}\n"
        f"  .tools/bin/kubectl apply -f examples/job.yaml\n"
        f"Stop it: make cluster-down"
    )
    return 0


def down(directory: Path) -> int:
    if not (directory / "state.json").exists():
        print("No cluster runs here.")
        return 0
    cluster = Cluster.load(directory)
    cluster.down()
    print(f"Stopped: {directory} (its data is kept until the next make cluster)")
    return 0


def status(directory: Path) -> int:
    if not (directory / "state.json").exists():
        print("No cluster runs here.")
        return 1
    cluster = Cluster.load(directory)
    for name, pid in cluster.pids.items():
        print(f"{name:26} pid {pid:7}  {'running' if cp.alive(pid) else 'STOPPED'}")
    return 1 if cluster.dead() or not cluster.pids else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.controlplane")
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--dir", type=Path, default=DIRECTORY)
    args = parser.parse_args(argv)
    return {"up": up, "down": down, "status": status}[args.command](args.dir)


if __name__ == "__main__":
    sys.exit(main())
