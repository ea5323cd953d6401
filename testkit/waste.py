"""What the retry-waste tests and the operations pack's scrape share: the metric's name
and a container whose requests make every resource of it appear."""

from __future__ import annotations

WASTED = "retry_webhook_wasted_resource_seconds_total"
#: A container that requests cpu, memory and a GPU: each becomes a ``resource`` of WASTED.
MAIN = {
    "name": "main",
    "image": "ghcr.io/example/train:1.0.0",
    "resources": {
        "requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "4Gi", "nvidia.com/gpu": "1"},
    },
}
