"""The reconcilers a leading controller runs, built from its cluster connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.cluster.events import EventSink, WorkloadResolver, instance_name, recorder_for
from webhook.controller.audits import AuditReporter
from webhook.controller.disruptions import Disruptions
from webhook.controller.failedjobs import FailedJobs
from webhook.controller.gates import GateReleaser
from webhook.controller.jobwatch import SharedJobs
from webhook.controller.manager import ControllerOptions, Reconciler
from webhook.controller.recorder import HistoryRecorder
from webhook.controller.restarts import InPlaceBudget
from webhook.controller.verdicts import Verdicts
from webhook.kinds.registry import WORKLOADS
from webhook.policy.config import Config


def build(
    api_client: Any,
    options: ControllerOptions,
    events: EventSink | None = None,
    resolver: WorkloadResolver | None = None,
    recorder: Any = None,
    config: Callable[[], Config] = Config,
) -> list[Reconciler]:
    """Every reconciler, sharing one API client (and its connection pool), one Event
    recorder (the process's, whose counts its metrics sample; made here when not given)
    and the controller's metrics (``recorder``: ``webhook.serving.metrics.ControllerMetrics``);
    ``config``: the cluster config as it is now (its failure categories)."""
    from kubernetes import client

    if events is None:
        events, resolver = recorder_for(api_client, instance_name(), WORKLOADS)
    batch = client.BatchV1Api(api_client)
    # One watch of Jobs for the three reconcilers that read them (webhook.controller.jobwatch).
    jobs = SharedJobs(batch)
    history = HistoryRecorder(api_client, events=events, metrics=recorder, jobs=jobs, config=config)
    return [
        history,
        FailedJobs(batch, client.CoreV1Api(api_client), events, resolver, jobs=jobs),
        GateReleaser(client.CoreV1Api(api_client), recorder, events=events),
        # The budgets per cause (``webhook.plan.causes``); a workload's disruption counts
        # and failure history in one patch of its record.
        Disruptions(
            api_client, events, recorder, peer_mark_limit=options.peer_mark_limit, history=history
        ),
        InPlaceBudget(api_client, events, recorder),
        # Failure verdicts and start deadlines (``webhook.plan.verdicts``); the free
        # failures' counts and the failure history in one patch of a workload's record.
        Verdicts(api_client, events, recorder, jobs=jobs, config=config, history=history),
        # What audited defaults would have done (``webhook.plan.replay``).
        AuditReporter(api_client, events, recorder, jobs=jobs),
        # Last: its handlers' reconcilers are running when it lists.
        jobs,
    ]
