"""``retry-webhook test``: suites of cases that say how a manifest must be admitted and how
it must behave when it fails, run as a pipeline runs its tests.

A case names a manifest (and the object in it), the cluster defaults and Kubernetes
version to judge it by, failures in ``--simulate``'s grammar, and what must hold:
admitted or denied, warnings that must or must not appear, how the simulation ends
(``Succeeded``, or ``Failed`` with its reason, at which attempt) and, attempt by attempt,
what explain knows of each pod (``facts``). ``suite`` reads and checks the suites,
``runner`` runs the cases; the CLI prints a line per case and writes JUnit XML.
"""

from webhook.policytest.facts import FACTS
from webhook.policytest.runner import ERROR, FAILED, PASSED, CaseResult, report, run_suite
from webhook.policytest.suite import Suite, find

__all__ = [
    "ERROR",
    "FACTS",
    "FAILED",
    "PASSED",
    "CaseResult",
    "Suite",
    "find",
    "report",
    "run_suite",
]
