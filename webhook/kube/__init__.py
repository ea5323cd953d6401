"""Kubernetes behaviour the policy relies on, reproduced from upstream source: the Job
controller's podFailurePolicy, API defaulting, resource quantities, pod-spec edits, Go's
regexp (JobSet message patterns), and telling written fields from defaulted ones."""
