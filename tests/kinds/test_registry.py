"""One list of kinds (``webhook.kinds.registry.KINDS``): a kind's code is its folder, its
line there and its explainer (with, outside the code, the chart, tests, an example and the
docs: docs/DEVELOPMENT.md, "A new kind"), and what else names the kinds is held to it: the
mutators, the views, API defaulting, the resources of a printed review, ``status``'s
references, ``explain``, and the chart's kind switches and webhook rules."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

from testkit.chart import CHART, render, webhooks
from testkit.tools import ROOT
from webhook.explain import explained_kinds
from webhook.kinds import registry
from webhook.kinds.base import Restores
from webhook.kinds.registry import KINDS
from webhook.kube import defaulting
from webhook.offline.review import admission_review
from webhook.status.reader import KINDS as STATUS_KINDS
from webhook.status.reader import parse_ref

KINDS_DIR = ROOT / "webhook" / "kinds"


def test_every_kind_folder_is_one_line_of_the_registry():
    folders = {p.name for p in KINDS_DIR.iterdir() if (p / "__init__.py").is_file()}
    assert folders == {spec.kind.lower() for spec in KINDS}
    assert len({(spec.group, spec.kind) for spec in KINDS}) == len(KINDS)


def test_each_kinds_mutator_is_its_own_and_is_the_one_the_engine_runs():
    for spec in KINDS:
        assert (spec.mutator.group, spec.mutator.kind) == (spec.group, spec.kind)
        assert registry.lookup(spec.group, spec.version, spec.kind) is spec.mutator
    assert registry.registered() == sorted((spec.group, spec.kind) for spec in KINDS)
    assert registry.lookup("apps", "v1", "Deployment") is None


def test_kinds_are_matched_on_group_version_and_kind():
    """Another version of a kind is not that kind: the API server names the version in
    every review (``request.kind``), and a batch/v2 Job would not be a batch/v1 Job."""
    for spec in KINDS:
        assert registry.lookup(spec.group, "v9", spec.kind) is None
        assert registry.known_kind(spec.group, spec.kind) is spec


def test_the_server_passes_an_unknown_kind_or_version_through_unchanged():
    from testkit.builders import FULL, job
    from testkit.workloads import mutate

    obj = job(FULL)
    obj["apiVersion"] = "batch/v2"
    verdict, _ = mutate(obj)
    assert verdict.allowed and verdict.patch == [] and verdict.warnings == []


def test_dry_run_warns_of_annotated_kinds_it_does_not_handle_and_unknown_versions():
    """--fail-on-warn fails on an annotated kind the webhook does not handle (naming
    those it does) and on a version of a kind it handles that is not served; a kind
    without annotations passes as the server passes it."""
    from testkit.cli import run

    mpijob = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "m", "annotations": {"retry-policy.dev/backoff-limit": "2"}},
        "spec": {},
    }
    code, _, err = run(["dry-run", "-f", "-", "--fail-on-warn"], stdin=yaml.safe_dump(mpijob))
    assert code == 1
    assert "MPIJob kubeflow.org/v2beta1 is not a kind the webhook handles" in err
    assert registry.handled() in err and "PyTorchJob kubeflow.org/v1" in registry.handled()
    v2 = {"apiVersion": "batch/v2", "kind": "Job", "metadata": {"name": "j"}, "spec": {}}
    code, _, err = run(["dry-run", "-f", "-", "--fail-on-warn"], stdin=yaml.safe_dump(v2))
    assert code == 1
    assert "Job batch/v2 is an unknown version (the API serves Job batch/v1)" in err
    plain = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
    code, _, err = run(["dry-run", "-f", "-", "--fail-on-warn"], stdin=yaml.safe_dump(plain))
    assert (code, err) == (0, "")


def test_explain_covers_every_kind_the_webhook_manages():
    assert explained_kinds() == registry.registered()


def test_each_kind_names_its_explainer_and_simulator_in_its_folder():
    """A kind's explainer is in its folder; its simulator too, or the Job controller's
    (``kinds/job/simulate.py``) for a kind counted as a Job is; each loads, and makes
    simulators (``plan.simulation.Simulator``: containers, ``run``)."""
    for spec in KINDS:
        assert spec.explainer is not None, spec.kind
        assert spec.explainer.module == f"webhook.kinds.{spec.kind.lower()}.explain"
        assert callable(spec.explainer.load())
        if spec.simulator is None:
            continue
        folder = spec.simulator.module.split(".")[2]
        assert folder in (spec.kind.lower(), "job"), (spec.kind, spec.simulator)
        assert callable(spec.simulator.load().run), spec.kind


def test_the_admission_path_imports_no_explainer_nor_simulator_nor_story():
    """What admission never runs stays unloaded in a server's process: the kinds name
    their explainers, simulators and story facts (``kinds.base.Named``), explain and
    status import them."""
    code = (
        "import sys\n"
        "import webhook.admission.engine, webhook.kinds.registry, webhook.serving.app\n"
        "print(sorted(m for m in sys.modules if m.startswith('webhook.') and"
        " (m.rsplit('.', 1)[-1] in ('explain', 'simulate', 'explaining', 'inplacewords',"
        " 'story'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_the_views_are_the_jobs_and_the_pods():
    """A view is worth its upkeep on the kinds admitted most: Jobs and their pods."""
    assert set(registry.VIEWS) == {("batch", "v1", "Job"), ("", "v1", "Pod")}


def test_api_defaulting_is_the_kinds_own():
    # upstream: SetDefaults_Job (pkg/apis/batch/v1/defaults.go), SetObjectDefaults_CronJob
    # (zz_generated.defaults.go), SetDefaults_Pod (pkg/apis/core/v1/defaults.go)
    assert {(s.group, s.kind): s.defaulter for s in KINDS if s.defaulter} == {
        ("batch", "Job"): defaulting.default_job,
        ("batch", "CronJob"): defaulting.default_cronjob,
        ("", "Pod"): defaulting.default_pod,
    }
    job = {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": {}}}}
    registry.apply_defaults(job)
    assert job["spec"]["backoffLimit"] == 6
    custom = {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {}}
    registry.apply_defaults(custom)
    assert custom == {"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {}}


def test_a_printed_review_names_each_kinds_resource():
    for spec in KINDS:
        obj = {"apiVersion": spec.api_version, "kind": spec.kind, "metadata": {"name": "x"}}
        request = admission_review(obj, "ml")["request"]
        assert request["resource"] == {
            "group": spec.group,
            "version": spec.version,
            "resource": spec.plural,
        }


def test_status_reads_every_kind_that_names_its_story_facts():
    assert STATUS_KINDS == tuple(spec for spec in KINDS if spec.story is not None)
    assert {spec.kind for spec in STATUS_KINDS} == {
        "Job",
        "CronJob",
        "JobSet",
        "TrainJob",
        "RayJob",
    }
    for spec in STATUS_KINDS:
        for name in spec.names:
            assert parse_ref(f"{name}/train").kind is spec


def test_each_kind_status_tells_names_its_story_facts_in_its_folder():
    """A kind's story facts are in its folder (``kinds/<kind>/story.py``), and what its
    controller makes for it (``kinds.story.Made``) is a kind status tells too."""
    from webhook.kinds.story import Made, StoryFacts

    for spec in STATUS_KINDS:
        assert spec.story is not None
        assert spec.story.module == f"webhook.kinds.{spec.kind.lower()}.story"
        facts = spec.story.load()
        assert isinstance(facts, StoryFacts), spec.kind
        if isinstance(facts.children, Made):
            made = registry.spec_for(
                facts.children.group, facts.children.version, facts.children.kind
            )
            assert made in STATUS_KINDS, (spec.kind, facts.children)


def test_the_charts_kind_switches_are_the_registrys():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["webhook"]["kinds"]) == {spec.chart_key for spec in KINDS}


def test_the_charts_webhook_rules_send_exactly_the_registrys_kinds(helm):
    docs = render(helm, {})
    workloads = [s for s in KINDS if s.kind != "Pod"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hooks = webhooks(docs, kind)
        side = "mutate" if kind.startswith("Mutating") else "validate"
        rules = hooks[f"workloads.{side}.retry-policy.dev"]["rules"]
        sent = {
            (group, version, resource, tuple(rule["operations"]))
            for rule in rules
            for group in rule["apiGroups"]
            for version in rule["apiVersions"]
            for resource in rule["resources"]
        }
        # The mutating webhook takes the UPDATEs of the kinds whose mutator re-applies
        # the policy then (a CronJob's template) or puts back what an update left out.
        updated = {
            s.plural
            for s in workloads
            if s.mutator.reevaluate_on_update or isinstance(s.mutator, Restores)
        }
        assert sent == {
            (
                s.group,
                s.version,
                s.plural,
                ("CREATE", "UPDATE") if side == "validate" or s.plural in updated else ("CREATE",),
            )
            for s in workloads
        }
        pods = hooks[f"pods.{side}.retry-policy.dev"]["rules"]
        assert {(r["apiGroups"][0], r["apiVersions"][0], r["resources"][0]) for r in pods} == {
            ("", "v1", "pods")
        }


def test_the_validating_webhook_sends_the_updates_of_every_budget_an_update_may_change(helm):
    """A kind whose budget may change after creation (``Mutator.budget_field``) has its
    UPDATE checked against its annotation: the chart must send those UPDATEs."""
    docs = render(helm, {})
    hook = webhooks(docs, "ValidatingWebhookConfiguration")["workloads.validate.retry-policy.dev"]
    cel = " ".join(c["expression"] for c in hook["matchConditions"])
    for spec in KINDS:
        obj = {"apiVersion": spec.api_version, "kind": spec.kind, "spec": {}}
        field = getattr(spec.mutator, "budget_field", lambda _: None)(obj)
        if field is None:
            continue
        assert spec.budget_field == field
        assert f"'{spec.kind}'" in cel
        assert "object." + ".".join(map(str, field.path)) in cel


def test_a_chart_key_lowercases_a_leading_acronym_whole():
    from webhook.kinds.base import chart_key

    assert [spec.chart_key for spec in KINDS] == [
        "jobs",
        "cronJobs",
        "jobSets",
        "trainJobs",
        "rayJobs",
        "pyTorchJobs",
        "pods",
    ]
    assert chart_key("MPIJob") == "mpiJobs" and chart_key("TFJob") == "tfJobs"


ROOT = KINDS_DIR.parent.parent
#: Files of the code, chart or test kit that name every kind in passing (examples in a
#: docstring or a comment), which a new kind need not touch.
NAMES_THEM_IN_PASSING = {
    "webhook/admission/engine.py": "comments on what UPDATEs mean, kind by kind",
    "webhook/kinds/base.py": "the chart keys a docstring shows",
}


def _guide_paths() -> list[str]:
    text = (ROOT / "docs" / "DEVELOPMENT.md").read_text()
    guide = text[text.index("## A new kind") : text.index("## Compiled modules")]
    roots = ("webhook/", "charts/", "testkit/", "tests/", "examples/", "docs/", "README.md")
    return [p for p in re.findall(r"`([^`\s]+)`", guide) if p.startswith(roots)]


def _names_every_kind(text: str) -> bool:
    lowered = text.lower()
    return all(spec.kind.lower() in lowered for spec in KINDS if spec.kind != "Pod")


def test_the_guide_lists_every_file_a_new_kind_touches():
    """DEVELOPMENT.md's "A new kind": each file it names exists for every kind there is
    (``<kind>``: the folder's name), each shared file names every kind (a list the new kind
    joins), and every file of the code, chart or test kit that names them all is listed."""
    listed = _guide_paths()
    assert len(listed) >= 18
    workloads = [spec for spec in KINDS if spec.kind != "Pod"]
    for path in listed:
        if "<kind>" in path:
            for spec in workloads:
                assert (ROOT / path.replace("<kind>", spec.kind.lower())).exists(), (path, spec)
        elif path.endswith("/"):
            assert (ROOT / path).is_dir(), path
        else:
            assert _names_every_kind((ROOT / path).read_text()), path
    tracked = subprocess.run(
        ["git", "ls-files", "webhook", "charts", "testkit"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    own = tuple(f"webhook/kinds/{spec.kind.lower()}/" for spec in KINDS)
    unlisted = [
        path
        for path in tracked
        if not path.startswith((*own, "testkit/controlplane/"))
        and (ROOT / path).is_file()
        and _names_every_kind((ROOT / path).read_text(errors="replace"))
        and path not in listed
        and path not in NAMES_THEM_IN_PASSING
    ]
    assert unlisted == []


def test_every_mutator_declares_what_the_engine_reads_of_it():
    """The engine types against ``kinds.base.Mutator`` and its optional Protocols instead of
    probing with ``getattr``: every kind's mutator must declare each attribute itself, and
    the kinds that restore or check updates must be seen to by type."""
    from webhook.kinds.base import ChecksUpdates

    for spec in KINDS:
        m = spec.mutator
        for name in ("group", "kind", "enforce_applied", "owns", "remember"):
            assert hasattr(m, name), (spec.kind, name)
        assert isinstance(m.reevaluate_on_update, tuple), spec.kind
    restoring = {s.kind for s in KINDS if isinstance(s.mutator, Restores)}
    assert restoring == {"JobSet", "TrainJob"}
    assert {s.kind for s in KINDS if not isinstance(s.mutator, ChecksUpdates)} == {"Pod"}
