"""What the tests and the benchmarks build with: objects as a cluster sends them, the HTTP
Kubernetes API, the played Job controller and kubelet, the real server started and
stopped, and the chart's RBAC and admission policy evaluated.

Not shipped (the wheel holds ``webhook`` only); importable from the repository's root,
where pytest (``pythonpath``) and ``python -m benchmarks.run`` run.
"""
