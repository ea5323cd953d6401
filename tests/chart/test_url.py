"""The chart's ``webhook.url``: both webhook configurations call a server outside the
cluster (a developer's, ``make cluster``'s) trusted through ``webhook.caBundle``, and the
chart deploys nothing that would serve in the cluster, while the ServiceAccount, its RBAC
and the admission policy that server acts under stay."""

from __future__ import annotations

from testkit.chart import objects, render, render_fails, webhooks

URL = {"webhook": {"url": "https://127.0.0.1:8443", "caBundle": "QUJD"}}


def test_every_webhook_calls_the_url_with_the_ca_bundle(helm):
    docs = render(helm, URL)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for name, hook in webhooks(docs, kind).items():
            config = hook["clientConfig"]
            assert "service" not in config, name
            assert config["caBundle"] == "QUJD", name
            assert config["url"] in (
                "https://127.0.0.1:8443/mutate",
                "https://127.0.0.1:8443/validate",
            )


def test_nothing_is_deployed_to_serve_in_the_cluster(helm):
    docs = render(helm, {**URL, "podDisruptionBudget": {"enabled": True}})
    kinds = {doc["kind"] for doc in docs}
    assert not {"Deployment", "Service", "PodDisruptionBudget", "Job"} & kinds
    assert {"ServiceAccount", "ClusterRole", "ValidatingAdmissionPolicy", "ConfigMap"} <= kinds
    assert not [d for d in objects(docs, "Secret")]


def test_without_the_url_the_webhooks_call_the_service(helm):
    docs = render(helm, {})
    for hook in webhooks(docs, "ValidatingWebhookConfiguration").values():
        assert "url" not in hook["clientConfig"] and "service" in hook["clientConfig"]


def test_a_url_without_its_ca_bundle_is_refused(helm):
    said = render_fails(helm, {"webhook": {"url": "https://127.0.0.1:8443"}})
    assert "webhook.caBundle" in said


def test_a_url_that_is_not_https_is_refused_by_the_schema(helm):
    said = render_fails(helm, {"webhook": {"url": "http://127.0.0.1:8443", "caBundle": "QUJD"}})
    assert "url" in said
