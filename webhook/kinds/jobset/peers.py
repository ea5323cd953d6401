"""``peer-disruptions`` on a JobSet: one write per disruption, not one per peer.

Admission put ``retryPolicyPeerDisruptions`` first in the JobSet's ``failurePolicy.rules``
(``webhook.kinds.jobset.failurepolicy.peer_rule``). When a pod of the set is disrupted, the
controller adds ``FailureTarget`` (reason ``PodFailurePolicy``, message
``retry-policy.dev/PeerDisrupted: ...``) to the pod's child Job, one ``jobs/status``
patch carrying the resourceVersion it read:

- the Job controller's ``syncJob`` finishes a Job that has ``FailureTarget=True`` as
  ``Failed`` with that condition's reason and message (``newFailedConditionForFailureTarget``
  in pkg/controller/job/job_controller.go) and deletes its active pods;
  ``ValidateJobStatusUpdate`` (pkg/apis/batch/validation) lets a client add the condition
  to a running Job (it refuses it beside ``SuccessCriteriaMet`` or ``Complete``);
- JobSet's ``findFirstFailedPolicyRuleAndJob`` takes the rules in order, each against every
  failed child Job: ours, first, applies to that Job (``ruleIsApplicable``) whatever else
  failed meanwhile, and restarts the set (``RestartJobSetAndIgnoreMaxRestarts`` for
  ``ignore``, ``RestartJobSet`` for ``count``): every child Job of the run is recreated,
  the peers stop with it.

Not written (``decided``) when the Job's end is decided already (``FailureTarget``,
``Failed``, ``Complete`` or ``SuccessCriteriaMet``: its own end decides), nor (``stale``)
when the pod's run is over (the set restarted or ended). ``None`` says the design does not
apply, and the caller marks the peers one by one (``webhook.controller.peers``): a JobSet
admitted without the rule, or a write the API refused (its Event says why).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from webhook.cluster.conditions import STRATEGIC, label, pod_name, status_patch
from webhook.cluster.events import Event
from webhook.cluster.informer import short_error
from webhook.kinds.jobset import failurepolicy as jsp
from webhook.kinds.services import Services
from webhook.kube.objects import controller_of, items, mapping
from webhook.kube.wellknown import JOBSET_NAME, JOBSET_UID, RESTART_ATTEMPT

log = logging.getLogger(__name__)

#: Seconds a Job's condition is tried again for after transient errors and conflicts.
PATIENCE = 30.0
REASON = "RetryDisruptionCounted"


class JobSetPeers:
    """The Job write that stands for a disrupted pod's peers in a JobSet."""

    def __init__(
        self,
        api_client: Any,
        workloads: Any,
        events: Any,
        writes: Any,
        clock: Callable[[], float],
        services: Services,
    ) -> None:
        from kubernetes import client

        self.batch = client.BatchV1Api(api_client)
        self.workloads = workloads
        self.events = events
        #: The Job conditions' failures (``webhook.controller.writes.Writes``).
        self.writes = writes
        self.clock = clock
        #: The controller's write retries and rate limits (``webhook.kinds.services``).
        self.services = services

    def fail_job(self, pod: Mapping[str, Any], cause: str) -> str | None:
        """Add our ``FailureTarget`` to the disrupted ``pod``'s child Job: "written",
        "decided", "stale", "gone", or ``None`` (mark the peers instead)."""
        meta = mapping(pod.get("metadata"))
        namespace = str(meta.get("namespace") or "")
        owner = controller_of(meta)
        name = label(pod, JOBSET_NAME)
        if not namespace or not name or owner is None or owner.get("kind") != "Job":
            return None
        jobset = self.workloads.current("jobset", namespace, name, label(pod, JOBSET_UID) or "")
        if jobset is None:
            return "gone"
        how = jsp.peer_rule_of(jobset)
        if how is None:
            return None
        status = mapping(jobset.get("status"))
        if status.get("terminalState") or label(pod, RESTART_ATTEMPT) != str(
            status.get("restarts") or 0
        ):
            return "stale"
        job = str(owner.get("name"))
        message = jsp.peer_message(pod_name(pod), cause, how)
        regarding = self.services.workload_of(pod)
        try:
            result = self.services.persist(
                self.writes,
                ("job", namespace, job),
                lambda: self._write(namespace, job, str(owner.get("uid")), message),
                regarding,
                f"condition {jsp.FAILURE_TARGET} on Job {job}",
                PATIENCE,
            )
        except Exception as err:
            log.warning("%s not added to Job %s: %s", jsp.FAILURE_TARGET, job, short_error(err))
            return "gone" if getattr(err, "status", None) == 404 else None
        if result == "written" and regarding is not None:
            counted = "not counted against maxRestarts" if how == "ignore" else "counted"
            note = (
                f"pod {pod_name(pod)} disrupted ({cause}): its Job {job} failed with "
                f"{jsp.FAILURE_TARGET} ({jsp.PEER_MESSAGE_PREFIX.strip()}); rule "
                f"{jsp.PEER_RULE_NAME} restarts the JobSet ({counted}), its peers stop with "
                f"the restart (peer-disruptions {how})"
            )
            self.events.emit(Event(regarding, "Normal", REASON, note, action="Mark"))
        return result

    def _write(self, namespace: str, name: str, uid: str, message: str) -> str:
        """Read the Job and add the condition with the resourceVersion read (a conflict
        raises: ``persist`` calls again, which reads again)."""
        # the read this write is computed from waits as the write does
        with self.services.critical():
            job = self.workloads.current("job", namespace, name, uid)
        if job is None:
            return "gone"
        if decided(job):
            return "decided"
        body = status_patch(jsp.FAILURE_TARGET, jsp.PEER_REASON, message, self.clock())
        version = str(mapping(job.get("metadata")).get("resourceVersion") or "")
        body["metadata"] = {"resourceVersion": version}
        resp = self.batch.patch_namespaced_job_status(
            name, namespace, body, _content_type=STRATEGIC, _preload_content=False
        )
        json.loads(resp.data)
        return "written"


def decided(job: Mapping[str, Any]) -> bool:
    """Whether the Job's end is decided already: one of ``DECIDED_CONDITIONS`` True."""
    conditions = items(mapping(job.get("status")).get("conditions"))
    return any(
        isinstance(c, dict)
        and c.get("type") in jsp.DECIDED_CONDITIONS
        and c.get("status") == "True"
        for c in conditions
    )
