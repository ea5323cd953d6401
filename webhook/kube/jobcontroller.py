"""The Job controller's words and pods (pkg/controller/job), written once here: the message
it fails a Job with when a FailJob rule of its podFailurePolicy matches, read back by one
parser, and the pod it makes from a Job's template.

- The message: ``matchPodFailurePolicy`` (pod_failure_policy.go) formats "Container %s for
  pod %s/%s failed with exit code %v matching %v rule at index %d" for a rule on exit codes
  (the container ``matchOnExitCodes`` found: ``getMatchingContainerFromList``), and "Pod
  %s/%s has condition %v matching %v rule at index %d" for one on pod conditions. ``syncJob``
  (job_controller.go) makes it the message of the Job's ``FailureTarget`` condition, then
  of its ``Failed`` one, reason ``PodFailurePolicy``. JobSet matches its
  ``onJobFailureMessagePatterns`` against it, so the mutator checks those patterns against
  it as pieces (``failjob_pieces``); explain shows it, status and the controller read it.
- The counting: ``syncJob`` fails a Job on a FailJob match, else once its counted failures
  exceed ``backoffLimit``; with ``backoffLimitPerIndex`` an index fails on a FailIndex
  match or a counted failure past its limit (``isIndexFailed``): ``FailureCounter``, which
  the explain simulators, the audit replay and ``status`` step or ask.
- The pod: ``GetPodFromTemplate`` (pkg/controller/controller_utils.go) copies the template's
  labels, annotations, finalizers and spec under ``generateName``, owned by the Job;
  ``manageJob`` (job_controller.go) adds its tracking finalizer
  (``appendJobCompletionFinalizerIfNotFound``) and, for an Indexed Job, on every container
  the ``JOB_COMPLETION_INDEX`` env var (``addCompletionIndexEnvVariables``), then for each
  index the annotation and label (``addCompletionIndexAnnotation``,
  ``addCompletionIndexLabel``: the PodIndexLabel gate, GA in 1.32), the hostname
  ``<job>-<index>``, the ``generateName`` ``<job>-<index>-`` (``podGenerateNameWithIndex``)
  and, with ``backoffLimitPerIndex``, the index's failures so far
  (``addIndexFailureCountAnnotation``); those helpers are in indexed_job_utils.go. The API
  server defaults the pod before any webhook sees it.
"""

from __future__ import annotations

import copy
import re
import string
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.kube import podspec
from webhook.kube.defaulting import INT32_MAX, default_pod
from webhook.kube.objects import items, mapping
from webhook.kube.wellknown import (
    COMPLETION_INDEX,
    COMPLETION_INDEX_ENV,
    INDEX_FAILURE_COUNT,
    JOB_TRACKING,
)

#: ``matchPodFailurePolicy``'s messages: a rule on exit codes, a rule on pod conditions.
EXIT_MESSAGE = (
    "Container {container} for pod {namespace}/{pod} failed with exit code {code} "
    "matching {action} rule at index {index}"
)
CONDITION_MESSAGE = (
    "Pod {namespace}/{pod} has condition {condition} matching {action} rule at index {index}"
)
#: ``syncJob``'s ``Failed`` condition messages for the reasons a Job's pods running out of
#: retries give it, and for a Job past its ``activeDeadlineSeconds`` (DeadlineExceeded).
BUDGET_MESSAGES = {
    "BackoffLimitExceeded": "Job has reached the specified backoff limit",
    "FailedIndexes": "Job has failed indexes",
    "MaxFailedIndexesExceeded": "Job has exceeded the specified maximal number of failed indexes",
}
DEADLINE_MESSAGE = "Job was active longer than specified deadline"
#: What each field can hold, for reading a message back: names without spaces, a
#: namespace without a slash, the exit code an int32 (``%v``), the action a word.
_FIELDS = {
    "container": r"\S+",
    "namespace": r"[^/\s]+",
    "pod": r"\S+",
    "code": r"-?\d+",
    "condition": r"\S+",
    "action": r"\w+",
    "index": r"\d+",
}


def never_instead(field: str) -> str:
    """What a denial for a pod template's ``restartPolicy: OnFailure`` ends with: what to
    change and what that changes. Under OnFailure the kubelet restarts a failed container
    in its pod, and the Job controller counts those restarts against ``backoffLimit``
    (``pastBackoffLimitOnFailure``, job_controller.go); under Never a failed container
    fails its pod and the controller makes a new pod for the retry, counting failed pods
    instead (``getNewFinishedPods``; ``syncJob`` compares ``failed`` with it)."""
    return (
        f"accepted: {field}: Never, under which a failed container fails its pod and the "
        "retry runs in a new pod (files in its emptyDir volumes start empty), counted "
        "against backoffLimit as its restarts are now"
    )


def never_instead_in_place(field: str, template: bool = True) -> str:
    """``never_instead`` for a pod (``template``: a workload's pod template, else a bare
    Pod's own spec) whose containers are to restart in place on some exit codes
    (``in-place-exit-codes``): under Never those exits still restart the container in its
    pod, no longer counted (``pastBackoffLimitOnFailure`` counts restarts only under
    OnFailure), and any other failure fails the pod, which a Job retries in a new pod and
    counts, and which ends a bare Pod (nothing makes another)."""
    other = (
        "the retry runs in a new pod (files in its emptyDir volumes start empty), counted "
        "against backoffLimit as its restarts are now"
        if template
        else "nothing retries a bare Pod"
    )
    return (
        f"accepted: {field}: Never, under which an exit with one of in-place-exit-codes "
        "still restarts the container in place"
        + (", no longer counted against backoffLimit" if template else "")
        + f", and any other failure fails the pod: {other}"
    )


#: ``syncJob``'s reasons for a Job its failed pods end: a FailJob match, too many counted
#: failures (job_controller.go; ``batch.JobReasonPodFailurePolicy``,
#: ``JobReasonBackoffLimitExceeded``).
POD_FAILURE_POLICY = "PodFailurePolicy"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
#: How an index fails (``isIndexFailed``): a FailIndex match, or past its per-index limit.
FAIL_INDEX = "FailIndex"
PAST_PER_INDEX_LIMIT = "backoffLimitPerIndex"


def exceeds_backoff_limit(failed: int, limit: int) -> bool:
    """``syncJob`` (pkg/controller/job/job_controller.go): ``exceedsBackoffLimit :=
    jobCtx.failed > *job.Spec.BackoffLimit``, ``failed`` the counted failures (those an
    Ignore rule matched are not)."""
    return failed > limit


def past_backoff_limit_on_failure(restarts: int, limit: int) -> bool:
    """``pastBackoffLimitOnFailure`` (job_controller.go), restartPolicy OnFailure: the
    container restarts of the Job's running and pending pods reach ``backoffLimit`` (any
    restart, when it is 0)."""
    return restarts > 0 if limit == 0 else restarts >= limit


def index_failed(action: str | None, counts: bool, failures_before: int, per_index: int) -> bool:
    """``isIndexFailed`` (pkg/controller/job/indexed_job_utils.go): a failed pod fails its
    index on a FailIndex match (``action``), or when it counts and its index's counted
    failures before it (the ``job-index-failure-count`` annotation) reach
    ``backoffLimitPerIndex``."""
    return action == FAIL_INDEX or (counts and failures_before >= per_index)


def exceeds_max_failed_indexes(failed_indexes: int, most: int | None) -> bool:
    """``syncJob``: ``jobCtx.failedIndexes.total() > *job.Spec.MaxFailedIndexes``
    (MaxFailedIndexesExceeded); ``most`` ``None``: no such limit."""
    return most is not None and failed_indexes > most


@dataclass(frozen=True)
class Ends:
    """What one failed pod ends: the Job (``POD_FAILURE_POLICY`` or
    ``BACKOFF_LIMIT_EXCEEDED``, in ``syncJob``'s order), and its index (``FAIL_INDEX`` or
    ``PAST_PER_INDEX_LIMIT``, with ``backoffLimitPerIndex``); ``None``: nothing."""

    job: str | None = None
    index: str | None = None


@dataclass
class FailureCounter:
    """The Job controller's count of one Job's failed pods (``syncJob``, job_controller.go;
    ``isIndexFailed``, indexed_job_utils.go), stepped one failed pod at a time: the counted
    failures (``status.failed`` less the pods an Ignore rule matched), and with
    ``backoffLimitPerIndex`` (``per_index``) those of each index."""

    backoff_limit: int
    per_index: int | None = None
    #: Counted failures, in all and by index.
    failed: int = 0
    by_index: dict[Hashable, int] = field(default_factory=dict)

    def step(self, action: str | None, counts: bool, index: Hashable = None) -> Ends:
        """One failed pod: ``action`` the podFailurePolicy rule it matched (``None``: none),
        ``counts`` whether it counts (``failurepolicy.counts``), ``index`` its completion
        index (with ``backoffLimitPerIndex``). Counts it, and says what it ends: a FailJob
        match the Job at once, else counted failures past ``backoffLimit``
        (``exceeds_backoff_limit``); and its index (``index_failed``)."""
        before = self.by_index.get(index, 0)
        if counts:
            self.failed += 1
            self.by_index[index] = before + 1
        job = None
        if action == "FailJob":
            job = POD_FAILURE_POLICY
        elif exceeds_backoff_limit(self.failed, self.backoff_limit):
            job = BACKOFF_LIMIT_EXCEEDED
        failed_index = None
        if self.per_index is not None and index_failed(action, counts, before, self.per_index):
            failed_index = FAIL_INDEX if action == FAIL_INDEX else PAST_PER_INDEX_LIMIT
        return Ends(job, failed_index)

    def counted(self, index: Hashable = None) -> int:
        """Counted failures of ``index``."""
        return self.by_index.get(index, 0)


@dataclass(frozen=True)
class FailJobMatch:
    """A FailJob message read back: the pod, the rule (its index in the Job's
    ``podFailurePolicy.rules``) and what matched it (a container's exit code, or a pod
    condition)."""

    namespace: str
    pod: str
    action: str
    index: int
    container: str | None = None
    exit_code: int | None = None
    condition: str | None = None


def failjob_message(
    namespace: str,
    pod: str,
    index: int | str,
    *,
    container: str | None = None,
    code: int | str | None = None,
    condition: str | None = None,
    action: str = "FailJob",
) -> str:
    """The message for a rule on exit codes (``container`` and ``code`` given), else for one
    on pod conditions."""
    if container is not None:
        return EXIT_MESSAGE.format(
            container=container, namespace=namespace, pod=pod, code=code, action=action, index=index
        )
    return CONDITION_MESSAGE.format(
        namespace=namespace, pod=pod, condition=condition, action=action, index=index
    )


def failjob_pieces(fields: Mapping[str, Any], template: str = EXIT_MESSAGE) -> list[Any]:
    """The message as pieces: its text, with each field's value as given (any object; a
    list stands for several pieces in a row), adjacent strings joined."""
    pieces: list[Any] = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts: list[Any] = [literal] if literal else []
        if name is not None:
            value = fields[name]
            parts += value if isinstance(value, list) else [value]
        for part in parts:
            if isinstance(part, str) and pieces and isinstance(pieces[-1], str):
                pieces[-1] += part
            else:
                pieces.append(part)
    return pieces


def _pattern(template: str) -> re.Pattern[str]:
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(f"(?P<{name}>{_FIELDS[name]})")
    return re.compile("".join(parts))


_PARSERS = (_pattern(EXIT_MESSAGE), _pattern(CONDITION_MESSAGE))


def parse_failjob_message(text: str) -> FailJobMatch | None:
    """``text`` read as one of ``matchPodFailurePolicy``'s messages, whole; ``None``:
    it is not one."""
    for pattern in _PARSERS:
        found = pattern.fullmatch(text)
        if found is None:
            continue
        parts = found.groupdict()
        code = parts.get("code")
        return FailJobMatch(
            parts["namespace"],
            parts["pod"],
            parts["action"],
            int(parts["index"]),
            parts.get("container"),
            int(code) if code is not None else None,
            parts.get("condition"),
        )
    return None


#: ``names.MaxGeneratedNameLength`` (k8s.io/apiserver pkg/storage/names): a name's 63
#: characters less the 5 random ones the API server appends to a ``generateName``.
MAX_GENERATED_NAME_LENGTH = 58


def pod_generate_name(job_name: str, index: int | None = None) -> str:
    """A Job's pod's ``generateName``: ``<job>-`` (``getPodsPrefix``), and for an index
    ``podGenerateNameWithIndex``'s ``<job>-<index>-``, the Job's name cut to fit
    ``MAX_GENERATED_NAME_LENGTH`` so that the index stays readable."""
    if index is None:
        return f"{job_name}-"
    suffix = f"-{index}-"
    prefix = job_name + suffix
    if len(prefix) > MAX_GENERATED_NAME_LENGTH:
        prefix = prefix[: MAX_GENERATED_NAME_LENGTH - len(suffix)] + suffix
    return prefix


def add_completion_index_env(spec: dict[str, Any]) -> None:
    """``addCompletionIndexEnvVariables``: every init container and container that has no
    ``JOB_COMPLETION_INDEX`` of its own gets one read from the pod's index label (the
    PodIndexLabel gate on)."""
    field = f"metadata.labels['{COMPLETION_INDEX}']"
    for container, env in podspec.envs(spec):
        if any(mapping(e).get("name") == COMPLETION_INDEX_ENV for e in env):
            continue
        entry = {"name": COMPLETION_INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": field}}}
        container["env"] = [*env, entry]


def add_completion_index(
    obj: dict[str, Any], job_name: str, index: int, index_failures: int | None = None
) -> None:
    """What ``manageJob`` writes into the template of an Indexed Job's pod of ``index``,
    written into ``obj`` (a pod template or a pod: both have ``metadata`` and ``spec``):
    the env var, the index as annotation and label, the hostname and, when
    ``index_failures`` is given (a per-index budget), the index's failures so far."""
    meta = obj["metadata"] = mapping(obj.get("metadata"))
    spec = obj["spec"] = mapping(obj.get("spec"))
    add_completion_index_env(spec)
    annotations = dict(mapping(meta.get("annotations")))
    labels = dict(mapping(meta.get("labels")))
    annotations[COMPLETION_INDEX] = labels[COMPLETION_INDEX] = str(index)
    if index_failures is not None:
        annotations[INDEX_FAILURE_COUNT] = str(index_failures)
    meta["annotations"], meta["labels"] = annotations, labels
    spec["hostname"] = f"{job_name}-{index}"


#: ``parseInt32``: what ``strconv.Atoi`` reads (an optional sign, then ASCII digits).
_ATOI = re.compile(r"[+-]?[0-9]+")


def index_failure_count(annotations: Any) -> int | None:
    """An Indexed Job's pod's failures of its index so far, as the Job controller reads
    them (``getIndexFailureCount``, ``parseIndexFailureCountAnnotation`` in
    indexed_job_utils.go): its ``job-index-failure-count``, a value that is not an int32
    of 0 or more (malformed, negative, too large) read as 0; ``None`` without the
    annotation (no per-index budget), which the controller reads as 0 too."""
    raw = mapping(annotations).get(INDEX_FAILURE_COUNT)
    if not isinstance(raw, str):
        return None
    if _ATOI.fullmatch(raw) is None:
        return 0
    value = int(raw)
    return value if 0 <= value <= INT32_MAX else 0


def pod_from_template(
    job: Mapping[str, Any], index: int | None = None, index_failures: int = 0
) -> dict:
    """The pod the Job controller would create now from ``job``'s template (see the
    module's doc: for an Indexed Job the completion index and, with a per-index budget,
    the index's failures so far), as its CREATE reaches a webhook: ``generateName``, no
    name, no uid, API defaults applied."""
    meta = mapping(job.get("metadata"))
    spec = mapping(job.get("spec"))
    name = str(meta.get("name"))
    template = copy.deepcopy(mapping(spec.get("template")))
    tmeta = mapping(template.get("metadata"))
    finalizers = list(items(tmeta.get("finalizers")))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": pod_generate_name(name),
            "namespace": meta.get("namespace"),
            "labels": dict(mapping(tmeta.get("labels"))),
            "annotations": dict(mapping(tmeta.get("annotations"))),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": meta.get("uid"),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": finalizers + ([] if JOB_TRACKING in finalizers else [JOB_TRACKING]),
        },
        "spec": mapping(template.get("spec")),
    }
    if index is None:
        default_pod(pod)
        return pod
    per_index = spec.get("backoffLimitPerIndex") is not None
    return index_pod(pod, name, index, index_failures if per_index else None)


def index_pod(
    pod: dict[str, Any], job_name: str, index: int, index_failures: int | None = None
) -> dict[str, Any]:
    """``pod``, a Job's, made its pod of ``index`` (``add_completion_index``, and its
    ``generateName``) and defaulted as the API server defaults it (the env var's
    ``fieldRef``); returned."""
    add_completion_index(pod, job_name, index, index_failures)
    pod["metadata"]["generateName"] = pod_generate_name(job_name, index)
    default_pod(pod)
    return pod
