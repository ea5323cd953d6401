"""The kinds the webhook manages, one folder each (``kinds/<kind>/``: its mutator, and its
``KindSpec``), one list (``registry.KINDS``); and what their mutators share: the workload
mutator (``workload``), a JobSpec's policy written (``jobspec``), restart rules written
(``inplace``), and the view of an object a mutator reads (``view``)."""
