"""A ValidatingAdmissionPolicy, as the chart renders it, evaluated the way the API server's
validating admission evaluates it, with cel-python (``celpy``) on the very expressions the
chart ships: so a test can tell which writes the policy lets through.

What is reproduced, from upstream (k8s.io/apiserver):

- which requests a policy sees: a rule of ``matchConstraints.resourceRules`` matches when
  its operations, groups, versions and resources hold the request's (``Matcher.Matches``,
  pkg/admission/plugin/webhook/predicates/rules/rules.go: ``pods/*`` matches ``pods`` and
  every subresource of it, ``*`` anything); then every ``matchConditions`` expression must
  be true;
- ``object`` and ``oldObject`` are the objects as unstructured JSON maps, ``null`` where
  there is none (``objectToResolveVal``, pkg/admission/plugin/cel/filter.go): ``object`` on
  DELETE, ``oldObject`` on CREATE; ``request`` an ``admission.k8s.io/v1``
  AdmissionRequest as JSON, empty fields left out (``CreateAdmissionRequest``): no
  ``subResource`` for a main resource;
- ``variables`` in order, each able to read the ones before (pkg/admission/plugin/cel/
  composition.go evaluates them lazily, by name: here eagerly, an error kept as the value,
  so that reading it is the error, as it would be);
- each validation: false denies with its ``messageExpression`` (else its ``message``); an
  error takes ``failurePolicy`` (``Fail``: denied).
- What the API server changes in a write before validating admission sees it
  (``admitted``): the writer's ``managedFields`` entry (the field manager), and
  ``generation`` raised when the spec changes (``updatePodGeneration``,
  pkg/registry/core/pod/strategy.go; the Job and custom resource strategies alike); the
  status of a main-resource write and the spec of a status write are the stored ones
  (``PrepareForUpdate`` of the pod and pod status strategies); uid, creation and deletion
  timestamps are the stored ones (``BeforeUpdate``, pkg/registry/rest/update.go).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import celpy

from webhook.kinds import registry

#: The kind of each resource the policy covers, as the registry names them.
KINDS = {spec.plural: (spec.group, spec.version, spec.kind) for spec in registry.KINDS}
#: Beside the workloads: the Events the controller writes (events.k8s.io).
KINDS["events"] = ("events.k8s.io", "v1", "Event")
#: The kinds of the pod subresources a client sends a body of (pods/eviction, binding, ...).
SUBRESOURCE_KINDS = {
    "eviction": ("policy", "v1", "Eviction"),
    "binding": ("", "v1", "Binding"),
    "exec": ("", "v1", "PodExecOptions"),
}
T1 = "2026-11-26T10:05:00Z"


def request(
    user: str,
    operation: str,
    resource: str,
    subresource: str = "",
    name: str = "train-x7k2p",
    namespace: str = "ml",
) -> dict[str, Any]:
    """An AdmissionRequest as the API server hands it to a policy."""
    group, version, kind = KINDS[resource]
    if subresource in SUBRESOURCE_KINDS:
        group, version, kind = SUBRESOURCE_KINDS[subresource]
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": KINDS[resource][0], "version": KINDS[resource][1], "resource": resource}
    out: dict[str, Any] = {
        "uid": "0d2f6a4e-6a2c-4d43-9a3c-5f1c2b7a9e10",
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {
            "username": user,
            "uid": "5c4b3a29-1f0e-4d3c-8b7a-6f5e4d3c2b1a",
            "groups": ["system:serviceaccounts", "system:authenticated"],
        },
        "dryRun": False,
    }
    if subresource:
        out["subResource"] = out["requestSubResource"] = subresource
    return out


@dataclass
class Verdict:
    matched: bool
    denials: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.denials


class Policy:
    """One rendered ValidatingAdmissionPolicy (its spec, compiled)."""

    def __init__(self, doc: dict[str, Any]):
        self.doc = doc
        spec = doc["spec"]
        self.env = celpy.Environment(runner_class=_Runner)
        self.failure_policy = spec.get("failurePolicy", "Fail")
        self.rules = spec["matchConstraints"]["resourceRules"]
        self.conditions = [self._compile(c["expression"]) for c in spec.get("matchConditions", [])]
        self.variables = [(v["name"], self._compile(v["expression"])) for v in spec["variables"]]
        self.validations = [
            (
                self._compile(v["expression"]),
                self._compile(v["messageExpression"]) if "messageExpression" in v else None,
                v.get("message") or f"failed expression: {v['expression']}",
            )
            for v in spec["validations"]
        ]

    def _compile(self, expression: str) -> Any:
        return self.env.program(self.env.compile(expression))

    def matches_rules(self, req: dict[str, Any]) -> bool:
        resource, sub = req["resource"], req.get("subResource", "")
        for rule in self.rules:
            if not (
                _any(rule["operations"], req["operation"])
                and _any(rule["apiGroups"], resource["group"])
                and _any(rule["apiVersions"], resource["version"])
            ):
                continue
            for pattern in rule["resources"]:
                res, _, res_sub = pattern.partition("/")
                if (res in ("*", resource["resource"])) and (res_sub in ("*", sub)):
                    return True
        return False

    def review(self, req: dict[str, Any], obj: Any, old: Any) -> Verdict:
        if not self.matches_rules(req):
            return Verdict(False)
        activation: dict[str, Any] = {
            "request": celpy.json_to_cel(req),
            "object": celpy.json_to_cel(obj),
            "oldObject": celpy.json_to_cel(old),
        }
        for program in self.conditions:
            matched = _evaluate(program, activation)
            if isinstance(matched, celpy.CELEvalError):
                if self.failure_policy == "Fail":
                    return Verdict(True, [f"matchCondition error: {matched}"])
                return Verdict(False)
            if not bool(matched):
                return Verdict(False)
        activation["variables"] = _Variables(self.variables, activation)
        denials = []
        for program, message_program, message in self.validations:
            result = _evaluate(program, activation)
            if isinstance(result, celpy.CELEvalError):
                if self.failure_policy == "Fail":
                    denials.append(f"expression error: {result}")
                continue
            if not bool(result):
                said = _evaluate(message_program, activation) if message_program else None
                denials.append(str(said) if isinstance(said, str) else message)
        return Verdict(True, denials)


def _any(items: list[str], value: str) -> bool:
    return "*" in items or value in items


def _evaluate(program: Any, activation: dict[str, Any]) -> Any:
    try:
        return program.evaluate(activation)
    except celpy.CELEvalError as err:
        return err


class _Evaluator(celpy.evaluation.Evaluator):
    """cel-python's evaluator, where it raises a Python exception on an error value that
    CEL propagates as an error (cel-spec, "Logical operators" and macros): a macro
    (``all``, ``exists``, ``filter``) over an error is that error, and so is ``error &&
    error`` (and ``||``). CEL's other rules (``true || error`` is true, ``false && error``
    false) are cel-python's own. Without this, the policy's guards (``variables.action !=
    'pods UPDATE' || ...``, whose right side reads ``object``, null on a DELETE) would not
    evaluate here as they do in the API server."""

    def member_dot_arg(self, tree: Any) -> Any:
        try:
            return super().member_dot_arg(tree)
        except TypeError as err:
            return celpy.CELEvalError(str(err), TypeError, None)

    def conditionalor(self, tree: Any) -> Any:
        return self._logical(tree, "conditionalor", celpy.celtypes.logical_or)

    def conditionaland(self, tree: Any) -> Any:
        return self._logical(tree, "conditionaland", celpy.celtypes.logical_and)

    def _logical(self, tree: Any, name: str, operator: Any) -> Any:
        if len(tree.children) != 2:
            return getattr(super(), name)(tree)
        left, right = self.visit_children(tree)
        if isinstance(left, celpy.CELEvalError) and isinstance(right, celpy.CELEvalError):
            return left
        try:
            return operator(left, right)
        except TypeError as err:
            return celpy.CELEvalError(str(err), TypeError, None)


class _Runner(celpy.InterpretedRunner):
    def evaluate(self, context: Any) -> Any:
        return _Evaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)


class _Variables(celpy.celtypes.MapType):
    """``variables``, each evaluated when first read (composition.go's lazy variables):
    one that cannot be evaluated for this request (``object.spec`` on a DELETE) is an
    error only where it is read."""

    def __init__(self, programs: list[tuple[str, Any]], activation: dict[str, Any]):
        super().__init__({celpy.celtypes.StringType(name): None for name, _ in programs})
        self._programs = dict(programs)
        self._activation = activation
        self._values: dict[str, Any] = {}

    def __getitem__(self, key: Any) -> Any:
        name = str(key)
        if name not in self._programs:
            raise KeyError(key)
        if name not in self._values:
            self._values[name] = _evaluate(self._programs[name], self._activation)
        return self._values[name]


# --- what the API server does to a write before validating admission sees it ---------------


def admitted(
    resource: str, subresource: str, obj: dict, old: dict, manager: str = "retry-webhook"
) -> dict:
    """``obj``, the object a write asks for, as validating admission sees it."""
    out = copy.deepcopy(obj)
    reset = "spec" if subresource == "status" else "status"
    if reset in old:
        out[reset] = copy.deepcopy(old[reset])
    else:
        out.pop(reset, None)
    meta = out.setdefault("metadata", {})
    meta["resourceVersion"] = old["metadata"].get("resourceVersion", "")
    for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
        if key in old["metadata"]:
            meta[key] = old["metadata"][key]
        else:
            meta.pop(key, None)
    entries = [
        e
        for e in meta.get("managedFields") or []
        if not (e.get("manager") == manager and e.get("subresource", "") == subresource)
    ]
    entry = {
        "manager": manager,
        "operation": "Update",
        "apiVersion": KINDS[resource][0] + "/" + KINDS[resource][1]
        if KINDS[resource][0]
        else KINDS[resource][1],
        "time": T1,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {}},
    }
    if subresource:
        entry["subresource"] = subresource
    meta["managedFields"] = [*entries, entry]
    if out.get("spec") != old.get("spec"):
        meta["generation"] = int(old["metadata"].get("generation") or 1) + 1
    return out


def gate(policy: Policy, user: str):
    """A ``FakeAPI.admit`` that runs ``policy`` on every write as ``user`` makes it."""

    def admit(operation: str, resource: str, sub: str, obj: Any, old: dict) -> str | None:
        if obj is not None:
            obj = admitted(resource, sub, obj, old)
        namespace = old["metadata"].get("namespace", "")
        req = request(user, operation, resource, sub, old["metadata"]["name"], namespace)
        verdict = policy.review(req, obj, old)
        return "; ".join(verdict.denials) if verdict.denials else None

    return admit
