"""The kinds the webhook manages, one folder each (``kinds/<kind>/``: its mutator, its
explainer, its simulator where it has one, its story facts for ``status``, and its
``KindSpec``), one list (``registry.KINDS``); and what they share: the workload mutator
(``workload``), a JobSpec's policy written (``jobspec``), restart rules written
(``inplace``), the view of an object a mutator reads (``view``), a JobSpec's plan and
restarts in place in words (``explaining``, ``inplacewords``), and what a story is told
with (``story``)."""
