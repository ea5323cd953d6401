"""The fake Nodes of the played cluster: spot and on-demand, each with capacity and the
labels our non-spot affinity reads (``webhook.policy.config``'s spot labels), as a
kubelet registers them (``registerWithAPIServer``, then ``setNodeStatus``).

A Node is kept alive by the played kubelet (``testkit.controlplane.kubelet``): its Ready
condition and its Lease in ``kube-node-lease``, renewed as the kubelet's
``nodelease.Controller`` does. A Node annotated ``kubelet.retry-policy.dev/stopped: "true"``
has lost its kubelet: no heartbeat, and nothing done to its pods, so that the real node
lifecycle controller sees an unreachable node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testkit.controlplane.podstatus import PREFIX, now, stamp

STOPPED = PREFIX + "stopped"
#: The Lease the kubelet renews (``kube-node-lease``), and for how long each renewal holds
#: (the kubelet's ``nodeLeaseDurationSeconds``, 40).
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
SPOT_LABEL = "cloud.google.com/gke-spot"
KUBE_VERSION = "v1.37.2"
#: What each played node's kubelet declares (``status.declaredFeatures``, KEP-5328): the
#: scheduler places a pod that uses a ``RestartAllContainers`` rule only on such a node.
DECLARED_FEATURES = ["RestartAllContainersOnContainerExits"]


@dataclass(frozen=True)
class NodeSpec:
    name: str
    spot: bool
    cpu: str = "16"
    memory: str = "64Gi"
    pods: str = "110"
    ip: str = "10.0.0.1"


DEFAULT_NODES = [
    NodeSpec("spot-a", spot=True, ip="10.0.0.11"),
    NodeSpec("spot-b", spot=True, ip="10.0.0.12"),
    NodeSpec("ondemand-a", spot=False, ip="10.0.0.21"),
    NodeSpec("ondemand-b", spot=False, ip="10.0.0.22"),
]


def node_object(spec: NodeSpec) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "played",
    }
    if spec.spot:
        labels[SPOT_LABEL] = "true"
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": spec.name, "labels": labels}}


def node_status(spec: NodeSpec) -> dict[str, Any]:
    """The status ``setNodeStatus`` reports: capacity, addresses, node info, and the
    conditions with Ready True."""
    when = stamp(now())
    resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": spec.pods}

    def condition(kind: str, status: str, reason: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": reason,
            "lastHeartbeatTime": when,
            "lastTransitionTime": when,
        }

    return {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [
            {"type": "InternalIP", "address": spec.ip},
            {"type": "Hostname", "address": spec.name},
        ],
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            condition("Ready", "True", "KubeletReady"),
        ],
        "nodeInfo": {
            "machineID": spec.name,
            "systemUUID": spec.name,
            "bootID": spec.name,
            "kernelVersion": "played",
            "osImage": "played kubelet (testkit.controlplane)",
            "containerRuntimeVersion": "played://1",
            "kubeletVersion": KUBE_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
        "declaredFeatures": DECLARED_FEATURES,
    }


def lease_object(spec: NodeSpec, node_uid: str) -> dict[str, Any]:
    """The node's Lease, owned by its Node (``nodelease.setNodeOwnerFunc``)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": spec.name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": node_uid}
            ],
        },
        "spec": {
            "holderIdentity": spec.name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": now().strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
