"""The names other projects give labels, annotations, finalizers, taints and API groups we
read or write: Kubernetes, JobSet, Kueue, Kubeflow Trainer, KubeRay and the Kubeflow
training operator. Each is spelled here once, as upstream spells it, beside the upstream
constant that defines it; every other module imports it from here
(``tests/kube/test_wellknown.py`` fails on a second spelling). Our own names
(``retry-policy.dev/*``) are in ``webhook.policy.model``.
"""

from __future__ import annotations

# --- Kubernetes: the Job and CronJob controllers (k8s.io/api batch/v1 types.go) ----------

#: ``batchv1.ControllerUidLabel``: the Job's UID, on its pods (the selector it generates).
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
#: ``batchv1.LegacyControllerUidLabel``: the same, unprefixed, still set.
LEGACY_JOB_UID_LABEL = "controller-uid"
#: ``batchv1.JobNameLabel``: the Job's name, on its pods.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
#: ``batchv1.LegacyJobNameLabel``: the same, unprefixed, still set.
LEGACY_JOB_NAME_LABEL = "job-name"
#: ``batchv1.JobCompletionIndexAnnotation``: an Indexed Job pod's index; the label too
#: (``addCompletionIndexLabel`` in pkg/controller/job/indexed_job_utils.go).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: ``completionIndexEnvName`` (pkg/controller/job/indexed_job_utils.go): the env var an
#: Indexed Job's containers read their index from (``addCompletionIndexEnvVariable``).
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
#: ``batchv1.JobIndexFailureCountAnnotation``: with ``backoffLimitPerIndex``, the index's
#: counted failures before this pod.
INDEX_FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
#: ``batchv1.JobIndexIgnoredFailureCountAnnotation``: the index's ignored failures.
INDEX_IGNORED_FAILURE_COUNT = "batch.kubernetes.io/job-index-ignored-failure-count"
#: ``batchv1.JobTrackingFinalizer``: on a Job's pod until the Job controller counted it.
JOB_TRACKING = "batch.kubernetes.io/job-tracking"
#: ``batchv1.CronJobScheduledTimestampAnnotation``: on a CronJob's Jobs and their pods.
CRONJOB_SCHEDULED_TIMESTAMP = "batch.kubernetes.io/cronjob-scheduled-timestamp"

# --- Kubernetes: the rest (k8s.io/api apps/v1 types.go, core/v1) --------------------------

#: ``appsv1.PodIndexLabel``: a StatefulSet pod's ordinal.
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
#: ``corev1.LabelHostname`` (core/v1 well_known_labels.go).
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: ``corev1.TaintNodeUnschedulable`` (core/v1 well_known_taints.go).
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
#: ``corev1.LastAppliedConfigAnnotation`` (core/v1 annotation_key_constants.go): what
#: client-side ``kubectl apply`` records.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
#: ``corev1.NamespaceTerminatingCause`` (core/v1 types.go): the cause the NamespaceLifecycle
#: admission gives for a create refused in a namespace being deleted.
NAMESPACE_TERMINATING = "NamespaceTerminating"

# --- JobSet (sigs.k8s.io/jobset: api/jobset/v1alpha2/jobset_types.go, unless said) --------

#: ``GroupVersion`` (api/jobset/v1alpha2/groupversion_info.go).
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
#: ``JobSetNameKey``: on a JobSet's child Jobs and their pods (labels and annotations,
#: ``labelAndAnnotateObject`` in pkg/controllers/jobset_controller.go).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
#: ``JobSetUIDKey`` (since JobSet v0.9.0).
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
#: ``ReplicatedJobNameKey``.
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
#: ``JobIndexKey``: the child Job's index within its replicated Job.
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
#: ``JobKey``: a hash of the child Job's namespaced name.
JOBSET_JOB_KEY = "jobset.sigs.k8s.io/job-key"
#: ``RestartsKey`` (pkg/constants/constants.go): the JobSet's ``status.restarts`` when
#: the child Job was made.
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
#: ``ExclusiveKey``: exclusive placement per topology domain.
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
#: ``NodeSelectorStrategyKey``: exclusive placement by node selectors instead.
NODE_SELECTOR_STRATEGY = "alpha.jobset.sigs.k8s.io/node-selector"

# --- Kueue (sigs.k8s.io/kueue) ------------------------------------------------------------

#: ``QueueLabel`` (pkg/controller/constants/constants.go): the LocalQueue of a workload.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: ``MultiKueueOriginLabel`` (apis/kueue/v1beta1/constants.go): on a worker cluster's copy
#: of a manager's Job or JobSet, set by the adapters' ``SyncJob``
#: (pkg/controller/jobs/job/job_multikueue_adapter.go; ``SetMultiKueueMeta`` in
#: pkg/controller/jobframework for a JobSet's).
MULTIKUEUE_ORIGIN = "kueue.x-k8s.io/multikueue-origin"
#: ``MultiKueueControllerName``: a manager's object's ``spec.managedBy`` when MultiKueue
#: runs it on a worker (the Job controller then skips it: ``managedByExternalController``
#: in kubernetes pkg/controller/job/job_controller.go).
MULTIKUEUE_MANAGED_BY = "kueue.x-k8s.io/multikueue"

# --- Kubeflow Trainer (github.com/kubeflow/trainer) ---------------------------------------

#: ``GroupVersion`` (pkg/apis/trainer/v1alpha1/groupversion_info.go).
TRAINER_GROUP = "trainer.kubeflow.org"
#: ``LabelTrainJobAncestor`` (pkg/constants/constants.go): which step of a TrainJob a
#: runtime's replicated Job runs.
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"

# --- KubeRay and the Kubeflow training operator -------------------------------------------

#: KubeRay's API group (``+groupName=ray.io``, ray-operator/apis/ray/v1/doc.go).
RAY_GROUP = "ray.io"
#: The training operator's ``GroupVersion`` (pkg/apis/kubeflow.org/v1/groupversion_info.go).
KUBEFLOW_GROUP = "kubeflow.org"

#: The API groups above: a string that starts with one and a slash is an apiVersion.
GROUPS = (JOBSET_GROUP, TRAINER_GROUP, RAY_GROUP, KUBEFLOW_GROUP)
