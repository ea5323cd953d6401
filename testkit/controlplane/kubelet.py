"""A played kubelet for the fake Nodes, working only through the real API server.

It never binds a pod (the real scheduler does). For each pod bound to one of its Nodes it
does what a kubelet does, through the API alone:

- runs it: one ``pods/status`` patch with phase ``Running``, ready containers, start
  times, a pod IP (the status manager's ``syncPod``: a strategic merge patch of the status
  with the pod's UID as precondition, so that conditions other components wrote, such as
  ``DisruptionTarget`` or ours, are kept); or, when the pod asks its containers never to
  start (``waiting-reason``), accepts it and leaves them waiting with that reason, phase
  ``Pending``, as the kubelet reports an image it cannot pull (the reason cache read by
  ``convertToAPIContainerStatuses``, pkg/kubelet/kubelet_pods.go);
- ends each container with the code the pod asks for (``podstatus``), and then restarts
  it in place or not as ``ContainerShouldRestart`` says (container restart rules, the
  container's and the pod's ``restartPolicy``), with the crash-loop back-off of the
  ``ReduceDefaultCrashLoopBackOffDecay`` gate (1 s, doubling, at most 60 s) shown as
  ``CrashLoopBackOff``;
- gives a pod whose containers have all stopped for good the phase ``getPhase``
  (pkg/kubelet/kubelet_pods.go) gives a terminal pod;
- fails a pod past its ``activeDeadlineSeconds`` (``activeDeadlineHandler.ShouldEvict``,
  pkg/kubelet/active_deadline.go: ``Failed``, reason ``DeadlineExceeded``), reading the
  deadline again on every update (our controller lowers it);
- stops a deleted pod's containers (``stop-exit-code``), writes its terminal phase, then
  deletes it with grace 0 and its UID as precondition (the status manager's
  ``canBeDeleted`` and ``syncPod``);
- keeps each Node Ready and renews its Lease (``nodelease.Controller``), unless the Node
  is marked stopped (``nodes.STOPPED``): then neither the heartbeat nor anything on its
  pods happens, as on a node that lost its kubelet.

Run it as ``python -m testkit.controlplane.kubelet --kubeconfig FILE NODE...``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import heapq
import itertools
import json
import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from testkit.controlplane import podstatus as ps
from testkit.controlplane.nodes import LEASE_NAMESPACE, STOPPED, NodeSpec, lease_object

log = logging.getLogger("kubelet")
STRATEGIC = "application/strategic-merge-patch+json"
#: How often each Node's Lease is renewed: the kubelet renews every quarter of the lease
#: duration (10 s of 40); the played one renews faster, so that a cluster may set a short
#: ``--node-monitor-grace-period`` and still never see a live node as lost.
RENEW_SECONDS = 2.0
#: How often the Node's Ready condition is reported again when nothing changed
#: (``nodeStatusReportFrequency``, 5 minutes upstream).
STATUS_REPORT_SECONDS = 60.0
BACKOFF_START, BACKOFF_MAX = 1.0, 60.0


@dataclass
class PodRun:
    """What the kubelet keeps of one pod it runs."""

    namespace: str
    name: str
    uid: str
    pod: dict[str, Any]
    #: This pod's place among its Job's pods that the kubelet ran (its first exit entry).
    ordinal: int = 0
    started: bool = False
    #: Set once the pod is terminal (its phase written): nothing is done to it but delete.
    finished: bool = False
    deleted: bool = False
    #: The containers were told to stop (SIGTERM): they exit ``stop-seconds`` later.
    stopping: bool = False
    #: Its containers never start (``waiting-reason``): accepted, never run.
    waiting: bool = False
    #: When the deadline timer is due (one timer per deadline the pod had).
    deadline_at: float = 0.0
    #: Container name -> its status as last written.
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Container name -> restarts so far (each takes the next exit entry).
    restarts: dict[str, int] = field(default_factory=dict)
    #: Container name -> the generation of its current run (a timer of an older one is stale).
    generation: dict[str, int] = field(default_factory=dict)
    start_time: dt.datetime | None = None


class Kubelet:
    def __init__(self, api_client: client.ApiClient, nodes: list[str]) -> None:
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.nodes = set(nodes)
        self.stopped: set[str] = set()
        self.runs: dict[str, PodRun] = {}
        #: Job UID -> pods of it the kubelet ran so far.
        self.ordinals: dict[str, int] = {}
        self.events: queue.Queue = queue.Queue()
        self.timers: list[tuple[float, int, tuple]] = []
        self.counter = itertools.count()
        self.ips = itertools.count(2)
        self.done = threading.Event()
        self.last_status: dict[str, float] = {}

    # --- the loops ------------------------------------------------------------------

    def run(self) -> None:
        threads = [
            threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self.watch_loop, name="watch", daemon=True),
        ]
        for thread in threads:
            thread.start()
        self.work_loop()

    def heartbeat_loop(self) -> None:
        """The node status loop and the node lease controller of every played Node."""
        while not self.done.is_set():
            for name in sorted(self.nodes):
                try:
                    self.heartbeat(name)
                except Exception as err:  # a heartbeat that fails is tried again next round
                    log.warning("heartbeat of %s: %s", name, err)
            self.done.wait(RENEW_SECONDS)

    def heartbeat(self, name: str) -> None:
        node = self.core.read_node(name)
        annotations = node.metadata.annotations or {}
        if annotations.get(STOPPED) == "true":
            if name not in self.stopped:
                log.info("node %s stopped: no heartbeat, its pods left alone", name)
            self.stopped.add(name)
            return
        if name in self.stopped:
            log.info("node %s back: heartbeat again, its pods synced", name)
            self.stopped.discard(name)
            self.last_status.pop(name, None)
            self.events.put(("resync",))
        self.renew_lease(name, node.metadata.uid)
        ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
        due = time.monotonic() - self.last_status.get(name, 0) > STATUS_REPORT_SECONDS
        if ready is None or ready.status != "True" or due:
            self.report_ready(name)
            self.last_status[name] = time.monotonic()

    def renew_lease(self, name: str, node_uid: str) -> None:
        renew = ps.now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            self.coordination.patch_namespaced_lease(
                name,
                LEASE_NAMESPACE,
                {"spec": {"holderIdentity": name, "renewTime": renew}},
                _content_type="application/merge-patch+json",
            )
        except ApiException as err:
            if err.status != 404:
                raise
            lease = lease_object(NodeSpec(name, spot=False), node_uid)
            self.coordination.create_namespaced_lease(LEASE_NAMESPACE, lease)

    def report_ready(self, name: str) -> None:
        when = ps.stamp(ps.now())
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": when,
            "lastTransitionTime": when,
        }
        self.core.patch_node_status(
            name, {"status": {"conditions": [ready]}}, _content_type=STRATEGIC
        )

    def watch_loop(self) -> None:
        """List, then watch, every pod; a watch that ends (410 Gone included) lists again."""
        while not self.done.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces(_preload_content=False)
                body = json.loads(listed.data)
                for pod in body["items"]:
                    self.events.put(("pod", "ADDED", pod))
                version = body["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=version,
                    timeout_seconds=300,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    if event["type"] == "ERROR":
                        break
                    if event["type"] == "BOOKMARK":
                        continue
                    self.events.put(("pod", event["type"], event["raw_object"]))
            except Exception as err:
                log.info("pod watch ended (%s); listing again", err)
                self.done.wait(0.5)

    def work_loop(self) -> None:
        """One thread does every pod's work, from watch events and timers, in order."""
        while not self.done.is_set():
            timeout = 1.0
            if self.timers:
                timeout = max(0.0, min(timeout, self.timers[0][0] - time.monotonic()))
            try:
                item = self.events.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is not None:
                self.safely(self.handle, item)
            while self.timers and self.timers[0][0] <= time.monotonic():
                _, _, action = heapq.heappop(self.timers)
                self.safely(self.fire, action)

    def safely(self, function, item) -> None:
        try:
            function(item)
        except ApiException as err:
            log.warning("%s: API %s %s", item[:2], err.status, err.reason)
        except Exception:
            log.exception("%s", item[:2])

    def later(self, seconds: float, action: tuple) -> None:
        heapq.heappush(self.timers, (time.monotonic() + seconds, next(self.counter), action))

    # --- pods -----------------------------------------------------------------------

    def handle(self, item: tuple) -> None:
        if item[0] == "resync":
            for run in list(self.runs.values()):
                self.sync(run)
            return
        _, kind, pod = item
        uid = pod["metadata"]["uid"]
        node = pod.get("spec", {}).get("nodeName")
        if node not in self.nodes:
            return
        if kind == "DELETED":
            self.runs.pop(uid, None)
            return
        run = self.runs.get(uid)
        if run is None:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return  # ended before this kubelet started: nothing left to do
            run = PodRun(pod["metadata"]["namespace"], pod["metadata"]["name"], uid, pod)
            self.runs[uid] = run
        run.pod = pod
        self.sync(run)

    def sync(self, run: PodRun) -> None:
        if run.pod["spec"].get("nodeName") in self.stopped:
            return
        meta = run.pod["metadata"]
        if run.finished:
            if meta.get("deletionTimestamp") and not run.deleted:
                self.delete(run)
            return
        if meta.get("deletionTimestamp"):
            if not run.started:
                self.delete(run)
            else:
                self.stop(run, reason="")
            return
        if not run.started:
            self.start(run)
        self.check_deadline(run)

    def start(self, run: PodRun) -> None:
        pod = run.pod
        owner = next(
            (o["uid"] for o in pod["metadata"].get("ownerReferences") or [] if o.get("controller")),
            run.uid,
        )
        run.ordinal = self.ordinals.get(owner, 0)
        self.ordinals[owner] = run.ordinal + 1
        moment = ps.now()
        run.start_time = moment
        run.started = True
        reason = ps.entry(ps.waiting_entries(pod), run.ordinal)
        if reason != ps.START:
            self.accept_waiting(run, reason, moment)
            return
        spec = pod["spec"]
        init = []
        for container in spec.get("initContainers") or []:
            if ps.is_sidecar(container):
                state = ps.running_state(moment)
                run.statuses[container["name"]] = ps.container_status(container, run.uid, state)
            else:
                state = ps.terminated_state(0, ps.stamp(moment), moment)
                init.append(ps.container_status(container, run.uid, state))
        for container in spec["containers"]:
            self.run_container(run, container, moment)
        node_ip = self.node_ip(spec["nodeName"])
        ip = f"10.244.{next(self.ips) // 250 % 250}.{next(self.ips) % 250 + 2}"
        status = {
            "phase": "Running",
            "hostIP": node_ip,
            "hostIPs": [{"ip": node_ip}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": ps.stamp(moment),
            "conditions": ps.conditions("Running", moment),
            "containerStatuses": self.regular_statuses(run),
        }
        sidecars = [
            run.statuses[c["name"]]
            for c in spec.get("initContainers") or []
            if c["name"] in run.statuses
        ]
        if init or sidecars:
            status["initContainerStatuses"] = init + sidecars
        self.patch_status(run, status)

    def accept_waiting(self, run: PodRun, reason: str, moment: dt.datetime) -> None:
        """The pod is accepted (``startTime``) but its containers never start: each waits
        with ``reason``, and the pod stays ``Pending``, not ready (``generateAPIPodStatus``)."""
        run.waiting = True
        for container in run.pod["spec"]["containers"]:
            state = ps.waiting_state(reason, container.get("image", ""))
            status = ps.container_status(container, run.uid, state)
            run.statuses[container["name"]] = status
        conditions = ps.waiting_conditions(moment)
        node_ip = self.node_ip(run.pod["spec"]["nodeName"])
        status = {
            "phase": "Pending",
            "hostIP": node_ip,
            "hostIPs": [{"ip": node_ip}],
            "startTime": ps.stamp(moment),
            "conditions": conditions,
            "containerStatuses": self.regular_statuses(run),
        }
        self.patch_status(run, status)
        self.check_deadline(run)

    def node_ip(self, name: str) -> str:
        with contextlib.suppress(Exception):
            node = self.core.read_node(name)
            for address in node.status.addresses or []:
                if address.type == "InternalIP":
                    return address.address
        return "10.0.0.1"

    def run_container(self, run: PodRun, container: dict[str, Any], moment: dt.datetime) -> None:
        name = container["name"]
        restarts = run.restarts.get(name, 0)
        run.generation[name] = run.generation.get(name, 0) + 1
        state = ps.running_state(moment)
        status = ps.container_status(container, run.uid, state, restarts)
        previous = run.statuses.get(name)
        if previous is not None and previous.get("lastState"):
            status["lastState"] = previous["lastState"]
        run.statuses[name] = status
        code = ps.entry(ps.exit_entries(run.pod), run.ordinal + restarts)
        if code != ps.RUN:
            seconds = ps.run_seconds(run.pod)
            self.later(seconds, ("exit", run.uid, name, run.generation[name], int(code)))

    def regular_statuses(self, run: PodRun) -> list[dict[str, Any]]:
        return [run.statuses[c["name"]] for c in run.pod["spec"]["containers"]]

    def fire(self, action: tuple) -> None:
        kind, uid = action[0], action[1]
        run = self.runs.get(uid)
        if run is None or run.finished or run.pod["spec"].get("nodeName") in self.stopped:
            return
        if kind == "exit":
            _, _, name, generation, code = action
            if run.generation.get(name) == generation and not run.pod["metadata"].get(
                "deletionTimestamp"
            ):
                self.container_exited(run, name, code)
        elif kind == "restart":
            _, _, name, generation = action
            if run.generation.get(name) == generation:
                container = self.container(run, name)
                self.run_container(run, container, ps.now())
                self.patch_status(run, {"containerStatuses": self.regular_statuses(run)})
        elif kind == "deadline":
            self.check_deadline(run)
        elif kind == "stop":
            self.stopped_by_kubelet(run, action[2])

    def container(self, run: PodRun, name: str) -> dict[str, Any]:
        return next(c for c in run.pod["spec"]["containers"] if c["name"] == name)

    def container_exited(self, run: PodRun, name: str, code: int) -> None:
        container = self.container(run, name)
        moment = ps.now()
        status = run.statuses[name]
        started = status["state"]["running"]["startedAt"]
        restart = ps.should_restart(container, run.pod["spec"], code)
        ended = ps.terminated_state(code, started, moment)
        if not restart:
            status.update(state=ended, ready=False, started=False)
            self.after_stop(run)
            return
        names = [name]
        if restart == "RestartAllContainers":
            names = [c["name"] for c in run.pod["spec"]["containers"]]
        for each in names:
            other = run.statuses[each]
            if each == name:
                last = ended
            else:
                running = other["state"].get("running") or {"startedAt": ps.stamp(moment)}
                last = ps.terminated_state(137, running["startedAt"], moment, ps.RESTARTING_ALL)
            run.restarts[each] = run.restarts.get(each, 0) + 1
            run.generation[each] = run.generation.get(each, 0) + 1
            backoff = min(BACKOFF_MAX, BACKOFF_START * 2 ** (run.restarts[each] - 1))
            waiting = {
                "waiting": {"reason": "CrashLoopBackOff", "message": f"back-off {backoff:g}s"}
            }
            other.update(
                state=waiting,
                lastState=last,
                ready=False,
                started=False,
                restartCount=run.restarts[each],
            )
            self.later(backoff, ("restart", run.uid, each, run.generation[each]))
        self.patch_status(
            run,
            {
                "conditions": [c for c in ps.conditions("Running", moment) if c["type"] != "Ready"]
                + [
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "ContainersNotReady",
                        "lastTransitionTime": ps.stamp(moment),
                    }
                ],
                "containerStatuses": self.regular_statuses(run),
            },
        )

    def after_stop(self, run: PodRun) -> None:
        """A container stopped for good: the pod is terminal once every regular container
        has (``getPhase`` with ``podIsTerminal``), else it keeps running."""
        moment = ps.now()
        regular = self.regular_statuses(run)
        if all("terminated" in s["state"] for s in regular):
            self.finish(run, ps.terminal_phase(regular), moment)
        else:
            self.patch_status(run, {"containerStatuses": regular})

    def finish(self, run: PodRun, phase: str, moment: dt.datetime, reason: str = "") -> None:
        """Write the terminal status: sidecars stopped too (0: they handle SIGTERM), the
        kubelet's conditions false, ``PodCompleted``."""
        spec = run.pod["spec"]
        sidecars = []
        for container in spec.get("initContainers") or []:
            status = run.statuses.get(container["name"])
            if status is not None and "running" in status["state"]:
                started = status["state"]["running"]["startedAt"]
                status.update(
                    state=ps.terminated_state(0, started, moment), ready=False, started=False
                )
                sidecars.append(status)
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": ps.conditions(phase, moment),
            "containerStatuses": self.regular_statuses(run),
        }
        if sidecars:
            init = [
                s
                for s in (run.pod.get("status", {}).get("initContainerStatuses") or [])
                if s["name"] not in {x["name"] for x in sidecars}
            ]
            status["initContainerStatuses"] = init + sidecars
        if reason:
            status["reason"] = reason
            status["message"] = ps.DEADLINE_MESSAGE
        run.finished = True
        self.patch_status(run, status)
        if run.pod["metadata"].get("deletionTimestamp"):
            self.delete(run)

    def stop(self, run: PodRun, reason: str) -> None:
        """The kubelet kills a pod (deleted, or past its deadline): SIGTERM, then the
        containers stop with ``stop-exit-code`` a moment later."""
        if not run.stopping:
            run.stopping = True
            self.later(ps.stop_seconds(run.pod), ("stop", run.uid, reason))

    def stopped_by_kubelet(self, run: PodRun, reason: str) -> None:
        moment = ps.now()
        code = ps.stop_exit_code(run.pod)
        for container in run.pod["spec"]["containers"]:
            status = run.statuses[container["name"]]
            run.generation[container["name"]] = run.generation.get(container["name"], 0) + 1
            state = status["state"]
            if "terminated" in state or (run.waiting and "waiting" in state):
                continue  # (a container that never started is left waiting)
            started = (state.get("running") or {}).get("startedAt") or ps.stamp(moment)
            status.update(
                state=ps.terminated_state(code, started, moment), ready=False, started=False
            )
        regular = self.regular_statuses(run)
        phase = "Failed" if reason else ps.terminal_phase(regular)
        self.finish(run, phase, moment, reason)

    def check_deadline(self, run: PodRun) -> None:
        seconds = run.pod["spec"].get("activeDeadlineSeconds")
        if seconds is None or run.start_time is None or run.finished:
            return
        left = (run.start_time + dt.timedelta(seconds=seconds) - ps.now()).total_seconds()
        if left <= 0:
            self.stopped_by_kubelet(run, "DeadlineExceeded")
        elif run.deadline_at != seconds:
            run.deadline_at = seconds
            self.later(left + 0.05, ("deadline", run.uid))

    def delete(self, run: PodRun) -> None:
        run.deleted = True
        try:
            self.core.delete_namespaced_pod(
                run.name,
                run.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=run.uid)
                ),
            )
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    def patch_status(self, run: PodRun, status: dict[str, Any]) -> None:
        body = {"metadata": {"uid": run.uid}, "status": status}
        try:
            self.core.patch_namespaced_pod_status(
                run.name, run.namespace, body, _content_type=STRATEGIC
            )
        except ApiException as err:
            if err.status in (404, 409):
                self.runs.pop(run.uid, None)
                return
            raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.controlplane.kubelet")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("nodes", nargs="+")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s kubelet %(message)s")
    api_client = config.new_client_from_config(config_file=args.kubeconfig)
    Kubelet(api_client, args.nodes).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
