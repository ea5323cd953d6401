"""The chart's operations pack, rendered by the real ``helm``: the PrometheusRule validated
against the Prometheus Operator's CRD schema (vendored in ``tests/data/crds``), each alert's
runbook a real section of docs/OPERATIONS.md, the Grafana dashboard holding what Grafana
needs, and every metric an alert or a panel queries scraped from a running server whose
controller acts on the test API."""

from __future__ import annotations

import json
import re
import time

import kubernetes_validate
import pytest
import yaml

from testkit.audits import ENDED, SAVED, audited_job, fail_until_ended
from testkit.builders import P, job, review
from testkit.chart import CHART, K8S_VERSION, NAMESPACE, one, render, render_fails, run_helm
from testkit.docs import anchors
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.gates import gated_pod
from testkit.jobsim import JobRun
from testkit.servers import eventually, free_port, start, stop
from testkit.tools import ROOT, tool
from testkit.waste import MAIN, WASTED
from testkit.workloads import mutate, validate_schema

pytestmark = pytest.mark.tools

OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
RULE_SCHEMA = ROOT / "tests" / "data" / "crds" / "prometheusrules.monitoring.coreos.com.v1.yaml"
PACK = {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}
DASHBOARD_KEY = "retry-policy-webhook.json"


@pytest.fixture(scope="module")
def helm() -> str:
    return tool("helm")


# --- PromQL, enough to find the metrics an expression reads ---------------------------

#: Words that are PromQL's own, never a metric: binary operators and modifiers.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
KEYWORDS |= {"group_left", "group_right", "inf", "nan"}
#: Followed by a parenthesised list of label names, not of expressions.
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
#: Aggregation operators, which may take their ``by (...)`` before the parenthesis.
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count"}
AGGREGATIONS |= {"count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
TOKEN = re.compile(
    r"(?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[a-z]*)"  # 0.99, 7, 1e3, 5m (a duration)
    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"|(?P<other>\S)"
)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers used as vectors (before ``{`` or
    ``[``, or bare), not functions or aggregations (before ``(``), keywords, label names
    (in matchers, ``by (...)`` and the like), strings, durations or Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^{}]*\}", "{}", text)  # label matchers (strings already out)
    text = re.sub(r"\[[^\[\]]*\]", "[]", text)  # ranges and subqueries
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana's $__rate_interval, ${datasource}
    tokens = [m for m in TOKEN.finditer(text) if m.lastgroup != "other" or m.group() != ","]
    names: set[str] = set()
    skip_list = False
    for i, token in enumerate(tokens):
        word = token.group()
        after = tokens[i + 1].group() if i + 1 < len(tokens) else ""
        if skip_list:
            skip_list = word != ")"
            continue
        if token.lastgroup != "name":
            continue
        if word.lower() in LABEL_LISTS and after == "(":
            skip_list = True
        elif word.lower() in KEYWORDS or after == "(":
            continue  # a keyword, a function or an aggregation
        elif word.lower() in AGGREGATIONS and after.lower() in ("by", "without"):
            continue
        else:
            names.add(word)
    return names


def family(name: str) -> str:
    """A sample's metric: a histogram's ``_bucket``, ``_sum`` and ``_count`` are its."""
    return re.sub(r"_(bucket|sum|count)$", "", name)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le) (rate(a_bucket{job=~"$job", x="{y}"}[$__rate_interval]))', {"a_bucket"}),
        ('(sum(leader{ns="a"}) or vector(0)) < 1', {"leader"}),
        ("min(expiry) - time() < 7 * 86400", {"expiry"}),
        ("histogram_quantile(0.99, sum(rate(h_bucket[5m])) by (le)) > 1e3", {"h_bucket"}),
        ("a / on(job) group_left(kind) b offset 5m > bool 0", {"a", "b"}),
        ('topk(10, sum without (pod) (increase(c_total{a="b"}[$__range])))', {"c_total"}),
        ("x:recorded:rate5m unless absent(y)", {"x:recorded:rate5m", "y"}),
    ],
)
def test_metric_names_are_found_in_promql(expr, names):
    assert metric_names(expr) == names


def test_a_histograms_samples_are_its_family():
    assert {family(n) for n in ("h_bucket", "h_sum", "h_count", "c_total")} == {"h", "c_total"}


# --- rendering ---------------------------------------------------------------------------


def rule_of(helm_path: str, values: dict | None = None) -> dict:
    return one(render(helm_path, {**PACK, **(values or {})}), "PrometheusRule")


def alerts_of(rule: dict) -> dict[str, dict]:
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def dashboard_map(helm_path: str, values: dict | None = None) -> dict:
    docs = render(helm_path, {**PACK, **(values or {})})
    (found,) = [d for d in docs if d["kind"] == "ConfigMap" and DASHBOARD_KEY in d.get("data", {})]
    return found


def dashboard_of(helm_path: str, values: dict | None = None) -> dict:
    return json.loads(dashboard_map(helm_path, values)["data"][DASHBOARD_KEY])


def panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def variable_metrics(dashboard: dict) -> set[str]:
    """The metrics the dashboard's query variables read (``label_values(metric, label)``)."""
    found = set()
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            found.add(re.fullmatch(r"label_values\((\w+),\s*\w+\)", var["definition"])[1])
    return found


def queried(helm_path: str) -> dict[str, set[str]]:
    """Every metric the pack queries -> where (alert names, panel titles, variables)."""
    where: dict[str, set[str]] = {}
    for name, rule in alerts_of(rule_of(helm_path)).items():
        for metric in metric_names(rule["expr"]):
            where.setdefault(metric, set()).add(name)
    dashboard = dashboard_of(helm_path)
    for panel in panels(dashboard):
        for target in panel["targets"]:
            for metric in metric_names(target["expr"]):
                where.setdefault(metric, set()).add(panel["title"])
    for metric in variable_metrics(dashboard):
        where.setdefault(metric, set()).add("variables")
    return where


def test_the_pack_is_off_by_default(helm):
    docs = render(helm, {})
    assert not [d for d in docs if d["kind"] == "PrometheusRule"]
    assert not [d for d in docs if "grafana_dashboard" in d["metadata"].get("labels", {})]


def test_the_pack_lints_and_its_configmap_is_valid_kubernetes(helm):
    result = run_helm(helm, "lint", "--strict", str(CHART), values=PACK)
    assert result.returncode == 0, result.stdout + result.stderr
    kubernetes_validate.validate(dashboard_map(helm), K8S_VERSION, strict=True)


def test_the_pack_needs_the_metrics_port(helm):
    for part in ("prometheusRule", "grafanaDashboard"):
        stderr = render_fails(helm, {part: {"enabled": True}, "metrics": {"port": 0}})
        assert "need the metrics port: set metrics.port" in stderr


# --- the PrometheusRule --------------------------------------------------------------------


def test_the_rule_is_valid_against_the_prometheus_operators_crd(helm):
    schema = yaml.safe_load(RULE_SCHEMA.read_text())
    for values in ({}, {"prometheusRule": {**PACK["prometheusRule"], "alertLabels": {"a": "b"}}}):
        rule = rule_of(helm, values)
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        validate_schema(rule, schema=schema)
        assert rule["metadata"]["namespace"] == NAMESPACE


def test_the_schema_check_finds_a_broken_rule(helm):
    schema = yaml.safe_load(RULE_SCHEMA.read_text())
    rule = rule_of(helm)
    rule["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    with pytest.raises(AssertionError, match="for"):
        validate_schema(rule, schema=schema)


#: What the issue asks the alerts to cover, and a metric each such alert must read.
COVERED = {
    "RetryWebhookAdmissionErrors": "retry_webhook_admission_duration_seconds_count",
    "RetryWebhookAdmissionSlow": "retry_webhook_admission_duration_seconds_bucket",
    "RetryWebhookNoLeader": "retry_webhook_controller_leader",
    "RetryWebhookGatesOverdue": "retry_webhook_retry_delay_gates_released_total",
    "RetryWebhookConditionsLate": "retry_webhook_controller_conditions_total",
    "RetryWebhookDisruptionsUncovered": "retry_webhook_controller_disruptions_uncovered_total",
    "RetryWebhookWritesRefused": "retry_webhook_controller_writes_total",
    "RetryWebhookWritesFailing": "retry_webhook_controller_writes_total",
    "RetryWebhookCertificateExpiring": "retry_webhook_certificate_expiry_timestamp_seconds",
    "RetryWebhookConfigReloadFailed": "retry_webhook_config_last_reload_successful",
}


def test_the_alerts_cover_admission_the_leader_gates_budgets_and_writes(helm):
    alerts = alerts_of(rule_of(helm))
    assert set(alerts) == set(COVERED)
    for name, metric in COVERED.items():
        assert metric in metric_names(alerts[name]["expr"]), name
        assert alerts[name]["labels"]["severity"] in ("critical", "warning")
        assert alerts[name]["annotations"]["summary"] and alerts[name]["annotations"]["description"]
    assert alerts["RetryWebhookAdmissionErrors"]["labels"]["severity"] == "critical"
    assert 'result="refused"' in alerts["RetryWebhookWritesRefused"]["expr"]
    assert 'reason="overdue"' in alerts["RetryWebhookGatesOverdue"]["expr"]


def test_every_alert_has_a_runbook_section_in_operations_md(helm):
    sections = anchors(OPERATIONS.read_text())
    base = "https://docs.example.com/retry-policy-webhook/docs/OPERATIONS.md"
    values = {"prometheusRule": {"enabled": True, "runbookBaseURL": base}}
    for with_url in (False, True):
        for name, alert in alerts_of(rule_of(helm, values if with_url else {})).items():
            runbook = alert["annotations"]["runbook"]
            path, _, anchor = runbook.partition("#")
            assert path == "docs/OPERATIONS.md" and anchor in sections, name
            assert anchor == name.lower()  # its section is headed by its name
            if with_url:
                assert alert["annotations"]["runbook_url"] == f"{base}#{anchor}"
            else:
                assert "runbook_url" not in alert["annotations"]


def test_the_alerts_select_the_release_and_take_thresholds_from_values(helm):
    selector = re.compile(r"\{([^{}]*)\}")
    default = alerts_of(rule_of(helm))
    for alert in default.values():
        matchers = selector.findall(alert["expr"])
        assert matchers and all(m.startswith(f'namespace="{NAMESPACE}"') for m in matchers)
    values = {
        "prometheusRule": {
            "enabled": True,
            "selector": 'job="rpw", cluster="eu-1"',
            "admissionErrorRatio": 0.05,
            "admissionLatencySeconds": 0.25,
            "alertLabels": {"team": "platform"},
        }
    }
    custom = alerts_of(rule_of(helm, values))
    for alert in custom.values():
        assert all(
            m.startswith('job="rpw", cluster="eu-1"') for m in selector.findall(alert["expr"])
        )
        assert alert["labels"]["team"] == "platform"
    assert custom["RetryWebhookAdmissionErrors"]["expr"].rstrip().endswith("> 0.05")
    assert custom["RetryWebhookAdmissionSlow"]["expr"].rstrip().endswith("> 0.25")


@pytest.mark.parametrize(
    "values", [{"controller": {"enabled": False}}, {"server": {"kube": "off"}}], ids=["off", "kube"]
)
def test_no_leader_is_alerted_only_where_a_controller_runs(helm, values):
    assert "RetryWebhookNoLeader" not in alerts_of(rule_of(helm, values))
    assert "RetryWebhookGatesOverdue" in alerts_of(rule_of(helm, values))


@pytest.mark.parametrize(
    "values",
    [
        {"prometheusRule": {"enabled": True, "unknown": 1}},
        {"prometheusRule": {"selector": "job=rpw"}},
        {"prometheusRule": {"selector": 'job="a"} or vector(1) #'}},
        {"prometheusRule": {"admissionErrorRatio": 2}},
        {"prometheusRule": {"admissionLatencySeconds": 0}},
        {"prometheusRule": {"runbookBaseURL": "docs.example.com"}},
        {"grafanaDashboard": {"enabled": "yes"}},
        {"grafanaDashboard": {"namespace": "Not_A_Namespace"}},
        {"grafanaDashboard": {"labels": {"a": 1}}},
    ],
)
def test_the_values_schema_refuses_what_would_break_the_pack(helm, values):
    assert "don't meet the specifications of the schema" in render_fails(helm, values)


# --- the Grafana dashboard ---------------------------------------------------------------


def test_the_dashboard_configmap_is_what_the_grafana_sidecar_loads(helm):
    found = dashboard_map(helm)
    assert found["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert found["metadata"]["namespace"] == NAMESPACE
    values = {
        "grafanaDashboard": {
            "enabled": True,
            "namespace": "monitoring",
            "labels": {"team": "platform"},
            "annotations": {"grafana_folder": "Batch"},
        }
    }
    moved = dashboard_map(helm, values)
    assert moved["metadata"]["namespace"] == "monitoring"
    assert moved["metadata"]["labels"]["team"] == "platform"
    assert moved["metadata"]["annotations"] == {"grafana_folder": "Batch"}


def test_the_dashboard_has_what_grafana_requires(helm):
    dashboard = dashboard_of(helm)
    assert dashboard["title"] and dashboard["uid"] == "retry-policy-webhook"
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    (source,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert source["query"] == "prometheus" and source["name"] == "datasource"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["type"] and panel["title"], panel
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h")), panel["title"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
    for panel in panels(dashboard):
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"] and target["refId"]
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_the_dashboards_panels_do_not_overlap(helm):
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard_of(helm)["panels"]:
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[(x, y)] = panel["title"]


#: What the issue asks the dashboard to show, and a metric its panels must read for it.
SHOWN = {
    "admissions and latency": "retry_webhook_admission_duration_seconds_bucket",
    "decisions by kind": "retry_webhook_denials_total",
    "the controller's state": "retry_webhook_controller_leader",
    "gates": "retry_webhook_retry_delay_gates_pending",
    "budgets": "retry_webhook_controller_conditions_total",
    "Events written": "retry_webhook_events_total",
    "retry waste by cause and resource": WASTED,
    "audited workloads, differed or not": ENDED,
    "audit savings": SAVED,
}


def test_the_dashboard_shows_what_the_issue_asks(helm):
    dashboard = dashboard_of(helm)
    read = {m for p in panels(dashboard) for t in p["targets"] for m in metric_names(t["expr"])}
    assert {topic: metric for topic, metric in SHOWN.items() if metric not in read} == {}
    (table,) = [p for p in panels(dashboard) if p["title"].startswith("Wasted by cause")]
    assert "by (resource, cause)" in table["targets"][0]["expr"]


# --- every metric queried is exported ------------------------------------------------------


def exercised(api: FakeAPI, srv) -> None:
    """What makes the server export its metrics: reviews patched and denied, a Job with a
    disruption budget whose pod the kubelet evicts (counted, recorded, what it wasted, an
    Event), a pod held by a retry-delay gate, released, and an audited Job that fails
    (what its defaults would have saved)."""
    annotated = job({P + "backoff-limit": "2"}, containers=[MAIN])
    assert srv.review("/mutate", review(annotated))["response"]["allowed"]
    denied = srv.review("/validate", review(job({P + "backoff-limit": "many"})))
    assert not denied["response"]["allowed"]
    verdict, admitted = mutate(
        job(
            {
                P + "ignore-disruptions": "true",
                P + "max-disruptions": "1",
                P + "backoff-limit": "1",
            },
            name="evicted",
            containers=[MAIN],
        )
    )
    assert verdict.allowed, verdict.message
    run = JobRun.store(api, {**admitted, "metadata": {**admitted["metadata"], "uid": "uid-ev"}})
    run.evict_by_kubelet(run.new_pod())
    api.put("pods", gated_pod("held", time.time() - 1))
    fail_until_ended(JobRun.store(api, audited_job("audited")), 42)


def test_every_metric_the_pack_queries_is_one_the_server_exports(helm, tmp_path):
    wanted = queried(helm)
    assert WASTED in wanted and "retry_webhook_controller_leader" in wanted
    api = FakeAPI().start()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    srv = start(
        tmp_path / "certs",
        "--kube",
        "kubeconfig",
        *("--lease-duration", "2", "--renew-deadline", "1.5", "--retry-period", "0.2"),
        workers=2,
        metrics_port=free_port(),
        env={"KUBECONFIG": str(kubeconfig)},
    )
    try:
        exercised(api, srv)

        def missing() -> dict[str, set[str]]:
            exported = {name for name, _ in srv.metrics()}
            return {m: w for m, w in wanted.items() if m not in exported}

        try:
            eventually(lambda: not missing(), 30, 0.5)
        except AssertionError:
            pytest.fail(f"queried but not exported (metric: where): {missing()}")
        exported = {family(name) for name, _ in srv.metrics()}
        assert {family(m) for m in wanted} <= exported
    finally:
        stop(srv)
        api.stop()
