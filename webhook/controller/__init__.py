"""The controller half of the server: acts between attempts, hours after admission.

A leader-elected process beside the admission workers (``manager``), on a Lease
(``lease``). Admission and the controller are peers: neither imports the other, and the
workers learn what the controller does only from what it writes on the cluster's
objects and from its leadership note (``webhook.cluster.leadership``).
"""
