"""What a ServiceAccount may do, by the rendered chart's RBAC, and the requests a test API
saw, as RBAC reads them: so a test can run the server or controller against the HTTP test
API and check that the chart grants every call it made (and nothing it did not need is
asked for in vain in a real cluster).

Request attributes follow the API server's ``RequestInfoFactory.NewRequestInfo``
(k8s.io/apiserver pkg/endpoints/request/requestinfo.go): ``/api/v1/...`` is the core
group, ``/apis/GROUP/VERSION/...`` the others; a GET of a collection is ``list`` (``watch``
with ``watch=true``), of one object ``get``; POST ``create``, PUT ``update``, PATCH
``patch``, DELETE ``delete``; ``namespaces/NS/`` sets the namespace. A rule matches as
``RuleAllows`` does (rbac/v1 helpers): its groups, resources (``resource/subresource`` for a
subresource) and verbs contain the request's, and ``resourceNames``, when set, the name.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs


@dataclass(frozen=True)
class Call:
    verb: str
    group: str
    resource: str
    namespace: str
    name: str

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else " cluster-wide"
        named = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{named}{where}"


def call_of(method: str, path: str, query: str) -> Call | None:
    """The RBAC attributes of one request; ``None`` for a non-resource URL (/version)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    params = parse_qs(query)
    if method == "GET":
        verb = "get" if name else ("watch" if params.get("watch") in (["true"], ["1"]) else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return Call(verb, group, resource, namespace, name)


def calls(requests: list[tuple[str, str]]) -> set[Call]:
    """The test API's request log (``(path, query)`` for reads, ``("METHOD path", query)``
    for writes) as RBAC calls."""
    found = set()
    for first, query in requests:
        method, _, path = first.partition(" ") if " " in first else ("GET", "", first)
        call = call_of(method, path, query)
        if call is not None:
            found.add(call)
    return found


def _allows(rule: dict, call: Call) -> bool:
    return (
        call.group in rule.get("apiGroups", [])
        and call.resource in rule.get("resources", [])
        and call.verb in rule.get("verbs", [])
        and (not rule.get("resourceNames") or call.name in rule["resourceNames"])
    )


def granted(docs: list[dict], account: str, namespace: str) -> list[tuple[str | None, dict]]:
    """(namespace or None for cluster-wide, rule) of every rule bound to the account."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    out = []
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == account
            and s.get("namespace") == namespace
            for s in binding.get("subjects", [])
        ):
            continue
        ref = binding["roleRef"]
        role = roles[(ref["kind"], ref["name"])]
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        out += [(scope, rule) for rule in role.get("rules", [])]
    return out


def denied(docs: list[dict], account: str, namespace: str, made: set[Call]) -> list[str]:
    """The calls in ``made`` that the account's RBAC would refuse."""
    rules = granted(docs, account, namespace)
    return sorted(
        str(call)
        for call in made
        if not any(
            (scope is None or scope == call.namespace) and _allows(rule, call)
            for scope, rule in rules
        )
    )


# --- the parts that write, and the chart's switches for them ---------------------------------

#: The pod writes each part of the webhook makes (``charts/.../templates/_writes.tpl``):
#: the controller's (gates released, budgets' conditions, a pod that used its restarts in
#: place given a deadline) and the workers' marks of pods a disruptor deleted. The tests that run a
#: part against the test API check that its calls are among these.
POD_WRITES: dict[str, set[tuple[str, str]]] = {
    "controller": {("patch", "pods"), ("patch", "pods/status")},
    "deletions": {("patch", "pods/status")},
}


def combinations() -> list[tuple[str, dict, frozenset[str]]]:
    """Every combination of the chart's switches for the parts that write, with a cluster
    connection: (a name, the values, the parts that are on). ``controller.enabled`` turns
    the controller on or off; ``webhook.deletions.enabled`` the deletion marks."""
    out = []
    for controller in (True, False):
        for deletions in (True, False):
            values = {
                "controller": {"enabled": controller},
                "webhook": {"deletions": {"enabled": deletions}},
            }
            on = frozenset(
                part
                for part, flag in (("controller", controller), ("deletions", deletions))
                if flag
            )
            state = {True: "on", False: "off"}
            name = f"controller-{state[controller]}-deletions-{state[deletions]}"
            out.append((name, values, on))
    return out


def pod_writes(parts: frozenset[str]) -> set[tuple[str, str]]:
    """The pod writes ``parts`` make together."""
    return set().union(*(POD_WRITES[p] for p in parts)) if parts else set()
