"""Kubernetes behaviour the policy relies on, reproduced from upstream source: the names
upstream gives labels and annotations, the Job controller's podFailurePolicy, messages and
pods, the kubelet's restart rules, API defaulting, resource quantities, pod-spec edits,
Go's regexp (JobSet message patterns), and telling written fields from defaulted ones."""
