"""What the played kubelet reports for a pod, as pure functions of the pod and what its
containers did: the exit code a container ends with, whether it restarts, and the pod's
phase. Each follows the upstream function it names; the kubelet loop
(``testkit.controlplane.kubelet``) only does the I/O.

How a pod asks its containers to end, in its annotations (documented for users in
docs/CLUSTER.md):

- ``kubelet.retry-policy.dev/exit-code``: a comma list. The n-th pod of a Job that the
  kubelet runs (counted per owning Job, in the order it starts them) takes the n-th entry,
  and the last entry repeats; a container restarted in place takes the next entry on each
  restart. An entry is an exit code (0..255; ``137`` ends with reason ``OOMKilled``) or
  ``run``: the container keeps running until the pod is deleted or passes its deadline.
  Default ``0``.
- ``kubelet.retry-policy.dev/run-seconds``: how long a container runs before it exits
  (default 1).
- ``kubelet.retry-policy.dev/stop-exit-code``: the code a container exits with when the
  kubelet stops it (deletion, deadline): default 143, SIGTERM's.
- ``kubelet.retry-policy.dev/stop-seconds``: how long the containers take to exit after
  SIGTERM (default 1; within the pod's grace period).
- ``kubelet.retry-policy.dev/waiting-reason``: a comma list, taken as ``exit-code``'s is
  (the n-th pod of a Job takes the n-th entry, the last repeats). An entry is a reason a
  container never starts with, as the kubelet reports it (``ImagePullBackOff``,
  ``ErrImagePull``, ``InvalidImageName``, ``CreateContainerConfigError``, ...), or
  ``start``: the pod runs. A pod that waits is accepted (its ``startTime``, phase
  ``Pending``) with every regular container waiting with that reason, until it is deleted
  or passes its ``activeDeadlineSeconds`` (then ``Failed``, ``DeadlineExceeded``, its
  containers still waiting, as the kubelet leaves a container that never started). Default
  ``start``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

PREFIX = "kubelet.retry-policy.dev/"
EXIT_CODE = PREFIX + "exit-code"
RUN_SECONDS = PREFIX + "run-seconds"
STOP_EXIT_CODE = PREFIX + "stop-exit-code"
STOP_SECONDS = PREFIX + "stop-seconds"
WAITING_REASON = PREFIX + "waiting-reason"
RUN = "run"
START = "start"

#: ``RestartingAllContainers``: the reason the kubelet gives the containers it stops for a
#: ``RestartAllContainers`` rule (pkg/kubelet, ``getPhase`` reads it).
RESTARTING_ALL = "RestartingAllContainers"
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


def exit_entries(pod: dict[str, Any]) -> list[str]:
    """The pod's exit-code entries; a malformed one is an error that names it."""
    raw = (pod["metadata"].get("annotations") or {}).get(EXIT_CODE, "0")
    entries = [part.strip() for part in raw.split(",") if part.strip()]
    for entry in entries:
        if entry != RUN and not (entry.isdigit() and 0 <= int(entry) <= 255):
            raise ValueError(f"{EXIT_CODE}: {entry!r} is neither an exit code 0..255 nor {RUN!r}")
    return entries or ["0"]


def waiting_entries(pod: dict[str, Any]) -> list[str]:
    """The pod's waiting-reason entries; a malformed one is an error that names it."""
    raw = (pod["metadata"].get("annotations") or {}).get(WAITING_REASON, START)
    entries = [part.strip() for part in raw.split(",") if part.strip()]
    for item in entries:
        if not (item.isascii() and item.isalnum() and item[0].isalpha()):
            raise ValueError(f"{WAITING_REASON}: {item!r} is neither a reason nor {START!r}")
    return entries or [START]


def waiting_message(reason: str, image: str) -> str:
    """What the kubelet says with the reason: the image puller's back-off message
    (``ErrImagePullBackOff``'s ``Back-off pulling image``, pkg/kubelet/images), else the
    reason itself."""
    if reason == "ImagePullBackOff":
        return f'Back-off pulling image "{image}"'
    if reason == "ErrImagePull":
        return f'failed to pull and unpack image "{image}": not found'
    return f"played: {reason}"


def waiting_state(reason: str, image: str) -> dict[str, Any]:
    return {"waiting": {"reason": reason, "message": waiting_message(reason, image)}}


def entry(entries: list[str], n: int) -> str:
    """The n-th entry (from 0); the last one repeats."""
    return entries[min(n, len(entries) - 1)]


def run_seconds(pod: dict[str, Any]) -> float:
    raw = (pod["metadata"].get("annotations") or {}).get(RUN_SECONDS, "1")
    seconds = float(raw)
    if seconds < 0:
        raise ValueError(f"{RUN_SECONDS}: {raw!r} is negative")
    return seconds


def stop_seconds(pod: dict[str, Any]) -> float:
    raw = (pod["metadata"].get("annotations") or {}).get(STOP_SECONDS, "1")
    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    return max(0.0, min(float(raw), float(grace)))


def stop_exit_code(pod: dict[str, Any]) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(STOP_EXIT_CODE, "143"))


def exit_reason(code: int) -> str:
    """The terminated state's reason: what a container runtime reports for the code (a
    memory-limit kill is ``OOMKilled`` with 137; SIGKILL otherwise reads the same, and
    the played node has only the one kind of 137)."""
    if code == 0:
        return "Completed"
    return "OOMKilled" if code == 137 else "Error"


def matching_rule(container: dict[str, Any], code: int) -> dict[str, Any] | None:
    """``FindMatchingContainerRestartRule`` (pkg/api/v1/pod/util.go): the first rule whose
    exit codes match (``In`` the values, or ``NotIn`` them)."""
    for rule in container.get("restartPolicyRules") or []:
        codes = rule.get("exitCodes")
        if codes is None:
            continue
        inside = code in codes.get("values", [])
        if (codes.get("operator") == "In") == inside:
            return rule
    return None


def should_restart(container: dict[str, Any], spec: dict[str, Any], code: int) -> str:
    """``ContainerShouldRestart`` (pkg/api/v1/pod/util.go), with the
    ``RestartAllContainersOnContainerExits`` gate on: ``""`` (stays stopped),
    ``"Restart"`` or ``"RestartAllContainers"``. A matching rule decides, then the
    container's own ``restartPolicy``, then the pod's (default ``Always``)."""
    if container.get("restartPolicy") is not None:
        rule = matching_rule(container, code)
        if rule is not None and rule.get("action") in ("Restart", "RestartAllContainers"):
            return rule["action"]
        own = container["restartPolicy"]
        if own in ("Always", "OnFailure", "Never"):
            return "Restart" if own == "Always" or (own == "OnFailure" and code != 0) else ""
    policy = spec.get("restartPolicy", "Always")
    if policy == "Never":
        return ""
    if policy == "OnFailure":
        return "Restart" if code != 0 else ""
    return "Restart"


def is_sidecar(container: dict[str, Any]) -> bool:
    """``IsRestartableInitContainer``: an init container with ``restartPolicy: Always``."""
    return container.get("restartPolicy") == "Always"


def terminal_phase(statuses: list[dict[str, Any]]) -> str:
    """``getPhase`` for a pod the kubelet decided is terminal (``podIsTerminal``): every
    regular container stopped; ``Succeeded`` when each exited 0, else ``Failed``."""
    codes = [(s.get("state", {}).get("terminated") or {}).get("exitCode", 1) for s in statuses]
    return "Succeeded" if all(code == 0 for code in codes) else "Failed"


def running_state(started: dt.datetime) -> dict[str, Any]:
    return {"running": {"startedAt": stamp(started)}}


def terminated_state(code: int, started: str, finished: dt.datetime, reason: str = "") -> dict:
    return {
        "terminated": {
            "exitCode": code,
            "reason": reason or exit_reason(code),
            "startedAt": started,
            "finishedAt": stamp(finished),
            "containerID": "",
        }
    }


def container_status(
    container: dict[str, Any], pod_uid: str, state: dict[str, Any], restarts: int = 0
) -> dict[str, Any]:
    running = "running" in state
    return {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": f"played://{container.get('image', '')}",
        "containerID": f"played://{pod_uid}/{container['name']}/{restarts}",
        "ready": running,
        "started": running,
        "restartCount": restarts,
        "state": state,
        "lastState": {},
    }


def conditions(phase: str, moment: dt.datetime, initialized: bool = True) -> list[dict]:
    """The kubelet's own pod conditions for the phase (``generateAPIPodStatus``): ready
    while running, ``PodCompleted`` once terminal."""
    ready = phase == "Running"
    when = stamp(moment)

    def condition(kind: str, status: bool, reason: str = "") -> dict[str, Any]:
        out = {"type": kind, "status": "True" if status else "False", "lastTransitionTime": when}
        if reason:
            out["reason"] = reason
        return out

    done = "" if ready or phase == "Pending" else "PodCompleted"
    return [
        condition("PodReadyToStartContainers", phase == "Running"),
        condition("Initialized", initialized, "" if initialized else "ContainersNotInitialized"),
        condition("Ready", ready, done),
        condition("ContainersReady", ready, done),
    ]


def waiting_conditions(moment: dt.datetime) -> list[dict]:
    """A pod whose sandbox runs and whose containers wait (``generateAPIPodStatus``): ready
    to start containers, initialized, not ready (``ContainersNotReady``)."""
    when = stamp(moment)
    out = [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": when},
        {"type": "Initialized", "status": "True", "lastTransitionTime": when},
    ]
    for kind in ("Ready", "ContainersReady"):
        out.append(
            {
                "type": kind,
                "status": "False",
                "reason": "ContainersNotReady",
                "lastTransitionTime": when,
            }
        )
    return out
