"""The cluster tier's fixtures: one real control plane for the run (``testkit.controlplane``),
the chart installed with the real helm, our server serving it, and a namespace per test.

Every test here carries the ``cluster`` marker (``make test-cluster``); ``make test`` leaves
them out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit import servers
from testkit.controlplane.cluster import Cluster, free_ports
from testkit.controlplane.components import Timing
from testkit.controlplane.harness import Kube, Served
from testkit.controlplane.webhook import Release

HERE = Path(__file__).parent
#: The test cluster's clocks (docs/CLUSTER.md): the Job controller's pod failure back-off,
#: as upstream's integration tests shorten it, and the node monitor grace period.
TIMING = Timing(job_pod_failure_backoff="1s", node_monitor_grace_period="16s")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    control_plane = Cluster(tmp_path_factory.mktemp("cluster"), free_ports(), TIMING)
    control_plane.up(preexec=servers._with_parent_death(None))
    yield control_plane
    control_plane.down()


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Kube:
    return Kube(cluster)


@pytest.fixture(scope="session")
def served(cluster: Cluster) -> Served:
    """The chart installed with ``webhook.url`` at our server, and the server started."""
    release = Release(cluster, servers.free_port())
    release.install()
    handle = Served(release, preexec=servers._with_parent_death(None))
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture
def webhook(served: Served) -> Served:
    """Our server with the chart's default values, whatever the test before changed."""
    if served.release.values or served.server is None or served.server.proc.poll() is not None:
        served.reconfigure({})
    return served


@pytest.fixture
def ns(kube: Kube, request: pytest.FixtureRequest) -> str:
    """A namespace of the test's own, deleted after it (without waiting)."""
    name = kube.namespace(request.node.name.lower().replace("_", "-").replace("[", "-"))
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(autouse=True)
def no_write_of_ours_refused(served: Served, request: pytest.FixtureRequest):
    """After every test: the real API server refused none of our controller's writes
    (``retry_webhook_controller_writes_total{result="refused"}``: a 4xx given up) and
    none of its Events (``retry_webhook_events_total{result="dropped"}``) during the test,
    so the chart's RBAC and ValidatingAdmissionPolicy allow every write each scenario
    needed. Counted from the test's start: an earlier test's failure is its own."""
    before_server, before = _counted(served)
    yield
    server, samples = _counted(served)
    if server is None:
        return
    if server is not before_server:
        before = {}  # restarted during the test: its counters began at zero
    # A test that makes a write be refused on purpose names its writer.
    expected = {w for m in request.node.iter_markers("refused_writes") for w in m.args}
    refused = {
        writer: value - before.get((name, writer), 0)
        for (name, writer), value in samples.items()
        if name == "refused" and value > before.get((name, writer), 0) and writer not in expected
    }
    assert refused == {}, f"writes refused by the API server: {refused}\n{server.output()[-3000:]}"
    dropped = samples.get(("dropped", ""), 0) - before.get(("dropped", ""), 0)
    assert dropped == 0, f"Events dropped (refused by the API server?)\n{server.output()[-3000:]}"


def _counted(served: Served) -> tuple[object, dict[tuple[str, str], float]]:
    """The serving process and its refused writes by writer and dropped Events."""
    server = served.server
    if server is None or server.proc.poll() is not None or not server.metrics_port:
        return None, {}
    samples = server.metrics()
    counted = {
        ("refused", dict(labels).get("writer") or ""): value
        for (name, labels), value in samples.items()
        if name == "retry_webhook_controller_writes_total"
        and dict(labels).get("result") == "refused"
    }
    counted["dropped", ""] = servers.metric(samples, "retry_webhook_events_total", result="dropped")
    return server, counted
