"""retry-policy-webhook: retry and failure policy for batch and ML workloads, from annotations.

The packages, from the request inward:

- ``serving``: the HTTPS server (granian workers under our supervisor), the Flask app,
  metrics, logs, and live reload of mounted files.
- ``admission``: the AdmissionReview codec and the data path from a request to a verdict
  (the engine), with its memo and the patch by diffing.
- ``explain``: the same engine offline, as a retry plan in words (``retry-webhook explain``).
- ``offline``: what the offline commands share: manifests from files and directories,
  objects reviewed as the API server would, JUnit and SARIF reports.
- ``policytest``: suites of admission and retry-outcome cases (``retry-webhook test``).
- ``kinds``: one folder per kind (its mutator, editing a copy of the object; its explainer
  and simulator; its story facts for ``status``), and the one list of kinds
  (``kinds.registry``); the views a mutator runs on.
- ``plan``: the retry plan the kinds write and their readers share: the outcome of a
  policy run, the applied record, the per-cause rules, the plan as typed values, and the
  values an explanation and a simulation are made of.
- ``policy``: the annotation vocabulary and grammars, and the admins' cluster defaults.
- ``cluster``: what the server learns from the API server (attempts and failure history
  of Jobs, training runtimes) through watch caches, never on the request path.
- ``kube``: Kubernetes semantics the policy relies on, reproduced (podFailurePolicy,
  API defaulting, quantities, pod-spec helpers, Go regexps).
- ``tls``: certificates, made locally or kept in step in the cluster.
- ``problems``: errors as values, shared by all of the above.
"""
