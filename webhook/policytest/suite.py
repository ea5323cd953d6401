"""Test suites: YAML files of cases, read and checked before anything runs.

A suite names its manifests relative to itself, so a repository can keep its cases
beside what they test. Every problem of a suite is collected (errors as values): an
unknown key names the closest valid one, as the annotations do; a case that cannot run
(its manifest cannot be read, its object is not there, its events do not parse) is kept
with its problems, so one run reports them all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from webhook.kube.versions import KubeVersion
from webhook.offline import inputs
from webhook.offline.inputs import label
from webhook.plan.simulation import Event, ExplainError, parse_events
from webhook.policy.categories import names
from webhook.policy.config import Config, ConfigError, load_config, parse_config
from webhook.policy.model import did_you_mean
from webhook.policytest.facts import FACTS, OUTCOME_KEYS, SELECTORS, BadExpectation

API_VERSION = "retry-policy.dev/v1alpha1"
KIND = "TestSuite"
SUITE_KEYS = ("apiVersion", "kind", "name", "config", "kubernetesVersion", "namespace", "cases")
#: What a suite may set for all its cases, and a case for itself.
SHARED_KEYS = ("config", "kubernetesVersion", "namespace")
CASE_KEYS = ("name", "manifest", "object", "part", *SHARED_KEYS, "simulate", "expect")
EXPECT_KEYS = ("admitted", "denied", "warnings", "noWarnings", "outcome", "attempts")
STATES = ("Succeeded", "Failed")
#: An ``attempts`` entry: which pod (by the selectors), and the facts asserted, parsed.
Picked = tuple[dict[str, int], dict[str, Any]]


@dataclass
class Expect:
    admitted: bool = True
    #: A denial must say this (``""``: any denial).
    denied: str | None = None
    warnings: list[str] = field(default_factory=list)
    no_warnings: list[str] = field(default_factory=list)
    outcome: dict[str, Any] = field(default_factory=dict)
    attempts: list[Picked] = field(default_factory=list)

    @property
    def simulates(self) -> bool:
        return bool(self.outcome or self.attempts)


@dataclass
class Case:
    """One case, ready to run (``problems`` empty) or not."""

    suite: str
    number: int
    name: str
    problems: list[str] = field(default_factory=list)
    obj: dict[str, Any] | None = None
    #: Every object of the manifest file (a TrainJob's runtime is read from them).
    objects: list[dict[str, Any]] = field(default_factory=list)
    part: str | None = None
    config: Config = field(default_factory=Config)
    version: KubeVersion | None = None
    namespace: str | None = None
    events: list[Event] | None = None
    expect: Expect = field(default_factory=Expect)


@dataclass
class Suite:
    path: str
    name: str
    cases: list[Case] = field(default_factory=list)
    #: Problems of the suite as a whole (then no case runs).
    problems: list[str] = field(default_factory=list)


def is_suite(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and data.get("kind") == KIND
        and str(data.get("apiVersion", "")).startswith("retry-policy.dev/")
    )


def find(paths: Sequence[str]) -> tuple[list[Suite], list[str]]:
    """The suites ``paths`` name: a file is a suite (or a problem), a directory gives the
    suites among its YAML files and its subdirectories' (its manifests are not suites and
    are left alone). Also returns the paths that hold no suite at all."""
    suites, empty = [], []
    for path in paths:
        if not os.path.isdir(path):
            suites.append(load(path))
            continue
        found = []
        for name in inputs.files([path], recursive=True):
            if name.endswith(".json"):
                continue
            try:
                with open(name, encoding="utf-8") as handle:
                    head = next(yaml.safe_load_all(handle), None)
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue  # not a suite: a manifest's problems are dry-run's to report
            if is_suite(head):
                found.append(load(name))
        suites += found
        if not found:
            empty.append(path)
    return suites, empty


def load(path: str) -> Suite:
    suite = Suite(path, path)
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError) as err:
        suite.problems.append(f"cannot read {path}: {err}")
        return suite
    except yaml.YAMLError as err:
        suite.problems.append(f"{path} is not valid YAML: {err}")
        return suite
    if not is_suite(data):
        suite.problems.append(
            f"{path} is not a test suite: it needs apiVersion: {API_VERSION} and kind: {KIND}"
        )
        return suite
    problems = suite.problems
    if data["apiVersion"] != API_VERSION:
        problems.append(f"apiVersion {data['apiVersion']!r}: accepted: {API_VERSION}")
    unknown(data, SUITE_KEYS, "", problems)
    if isinstance(data.get("name"), str) and data["name"]:
        suite.name = data["name"]
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        problems.append("cases: a list of cases is needed (each with a manifest)")
        return suite
    if problems:
        return suite
    base = os.path.dirname(path)
    shared = {key: data[key] for key in SHARED_KEYS if key in data}
    for number, raw in enumerate(cases, 1):
        suite.cases.append(_case(path, base, number, raw, shared))
    return suite


def unknown(data: Mapping[str, Any], allowed: Sequence[str], where: str, out: list[str]) -> None:
    """An unknown key is a problem that names the closest valid one, as for annotations."""
    for key in data:
        if key not in allowed:
            hint = did_you_mean(str(key), list(allowed)) or "accepted: " + ", ".join(allowed)
            out.append(f"{where}{key}: unknown key; {hint}")


def _case(path: str, base: str, number: int, raw: Any, shared: Mapping[str, Any]) -> Case:
    where = f"cases[{number - 1}]"
    if not isinstance(raw, dict):
        return Case(path, number, f"case {number}", problems=[f"{where}: not a mapping"])
    name = raw.get("name") if isinstance(raw.get("name"), str) and raw.get("name") else None
    case = Case(path, number, name or f"case {number}")
    problems = case.problems
    unknown(raw, CASE_KEYS, f"{where}.", problems)
    merged = {**shared, **raw}
    case.namespace = _string(merged, "namespace", where, problems)
    case.part = _string(raw, "part", where, problems)
    case.version = _version(merged.get("kubernetesVersion"), where, problems)
    case.config = _config(merged.get("config"), base, f"{where}.config", problems)
    if "simulate" in raw:
        text = raw["simulate"]
        try:
            known = names(case.config.categories) if case.config is not None else None
            case.events = parse_events(str(text), known) if str(text).strip() else []
        except ExplainError as err:
            problems.append(f"{where}.simulate: {err}")
    case.expect = _expect(raw.get("expect"), f"{where}.expect", problems)
    _manifest(case, raw, base, where)
    if case.expect.simulates and case.events is None:
        case.events = []  # no failures: the first pod runs and succeeds
    return case


def _string(data: Mapping[str, Any], key: str, where: str, problems: list[str]) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        problems.append(f"{where}.{key}: {value!r} is not a string")
        return None
    return value


def _version(raw: Any, where: str, problems: list[str]) -> KubeVersion | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        # YAML reads 1.30 as the number 1.3: only a string says what was meant.
        problems.append(f'{where}.kubernetesVersion: {raw!r} is not a string; quote it: "1.35"')
        return None
    try:
        return KubeVersion.parse(raw)
    except ValueError as err:
        problems.append(f"{where}.kubernetesVersion: {raw!r} is not valid; {err}")
        return None


def _config(raw: Any, base: str, where: str, problems: list[str]) -> Config:
    """A cluster defaults file as ``--config`` takes it: its path (relative to the suite),
    or its content inline."""
    try:
        if raw is None:
            return Config()
        if isinstance(raw, str):
            return load_config(os.path.join(base, raw))
        if isinstance(raw, dict):
            return parse_config(yaml.safe_dump(raw), where)
    except ConfigError as err:
        problems.extend(f"{where}: {p}" for p in err.problems)
        return Config()
    problems.append(f"{where}: a path to a config file, or the config itself as a mapping")
    return Config()


def _manifest(case: Case, raw: Mapping[str, Any], base: str, where: str) -> None:
    """The object the case is about: the manifest's only one (a Trainer runtime beside a
    TrainJob does not count), or the one ``object: Kind/name`` picks."""
    manifest = raw.get("manifest")
    if not isinstance(manifest, str) or not manifest:
        case.problems.append(
            f"{where}.manifest: the manifest file (relative to the suite) is needed"
        )
        return
    docs = inputs.read(os.path.join(base, manifest))
    errors = [d.error for d in docs if d.error]
    if errors:
        case.problems.extend(f"{where}.manifest: {e}" for e in errors)
        return
    case.objects = [d.obj for d in docs if d.obj is not None]
    from webhook.kinds.trainjob.runtimes import is_runtime

    wanted = raw.get("object")
    if wanted is not None:
        picked = [o for o in case.objects if label(o) == wanted]
        if len(picked) != 1:
            there = ", ".join(label(o) for o in case.objects) or "nothing"
            case.problems.append(
                f"{where}.object: {wanted!r} is not one object of {manifest} (it holds {there})"
            )
            return
        case.obj = picked[0]
        return
    candidates = [o for o in case.objects if not is_runtime(o)]
    if len(candidates) != 1:
        there = ", ".join(label(o) for o in candidates) or "nothing"
        case.problems.append(
            f"{where}.object: {manifest} holds {there}; pick one with object: Kind/name"
        )
        return
    case.obj = candidates[0]


def _expect(raw: Any, where: str, problems: list[str]) -> Expect:
    expect = Expect()
    if raw is None:
        return expect
    if not isinstance(raw, dict):
        problems.append(f"{where}: a mapping of what must hold ({', '.join(EXPECT_KEYS)})")
        return expect
    unknown(raw, EXPECT_KEYS, f"{where}.", problems)
    admitted, denied = raw.get("admitted"), raw.get("denied")
    if admitted is not None and not isinstance(admitted, bool):
        problems.append(f"{where}.admitted: {admitted!r} is not true or false")
    if denied is not None:
        if isinstance(denied, bool) and denied:
            expect.denied = ""
        elif isinstance(denied, str) and denied:
            expect.denied = denied
        else:
            problems.append(f"{where}.denied: true, or a part of the denial's message")
    if expect.denied is not None and admitted is True:
        problems.append(f"{where}: admitted and denied cannot both hold")
    expect.admitted = expect.denied is None and admitted is not False
    if admitted is False and expect.denied is None:
        expect.denied = ""
    for key, target in (("warnings", expect.warnings), ("noWarnings", expect.no_warnings)):
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            problems.append(f"{where}.{key}: a list of texts (each a part of a warning)")
            continue
        target.extend(value)
    expect.outcome = _outcome(raw.get("outcome"), f"{where}.outcome", problems)
    expect.attempts = _attempts(raw.get("attempts"), f"{where}.attempts", problems)
    if expect.simulates and not expect.admitted:
        problems.append(f"{where}: a denied object is not simulated; drop outcome and attempts")
    return expect


def _outcome(raw: Any, where: str, problems: list[str]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        problems.append(f"{where}: a mapping of {', '.join(OUTCOME_KEYS)}")
        return {}
    unknown(raw, OUTCOME_KEYS, f"{where}.", problems)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "state" and value not in STATES:
            problems.append(f"{where}.state: {value!r}; accepted: " + ", ".join(STATES))
        elif key in SELECTORS and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            problems.append(f"{where}.{key}: {value!r} is not a whole number >= 1")
        elif key in ("reason", "message") and not (isinstance(value, str) and value):
            problems.append(f"{where}.{key}: {value!r} is not a text")
        elif key in OUTCOME_KEYS:
            out[key] = value
    return out


def _position(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _attempts(raw: Any, where: str, problems: list[str]) -> list[Picked]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        problems.append(f"{where}: a list, each entry picking a pod (attempt, pod or run)")
        return []
    allowed = (*SELECTORS, *FACTS)
    out = []
    for index, entry in enumerate(raw):
        at = f"{where}[{index}]"
        if not isinstance(entry, dict):
            problems.append(f"{at}: a mapping, e.g. {{attempt: 4, nonSpot: true}}")
            continue
        unknown(entry, allowed, f"{at}.", problems)
        wanted: dict[str, int] = {}
        facts: dict[str, Any] = {}
        for key, value in entry.items():
            if key in SELECTORS:
                if not _position(value):
                    problems.append(f"{at}.{key}: {value!r} is not a whole number >= 1")
                else:
                    wanted[key] = value
            elif key in FACTS:
                try:
                    facts[key] = FACTS[key].parse(value)
                except BadExpectation as err:
                    problems.append(f"{at}.{key}: {err}")
        if not wanted:
            problems.append(f"{at}: pick the pod with attempt, pod or run")
        if not any(k in FACTS for k in entry) and all(k in allowed for k in entry):
            problems.append(f"{at}: no fact to assert; known: {', '.join(FACTS)}")
        out.append((wanted, facts))
    return out
