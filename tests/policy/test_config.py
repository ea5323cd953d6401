"""Cluster defaults: loading, every problem listed, namespace overrides, guard rails."""

from __future__ import annotations

import pytest

from webhook.policy.config import DEFAULT_SPOT_NODE_LABELS, ConfigError, load_config, parse_config

GOOD = """
defaults:
  fail-non-retriable: true
  retriable-exit-codes: [143, 137]
  backoff-limit: 3
  ignore-disruptions: true
  non-spot-attempts: 1
  error-propagation: earliest
guardRails:
  maxBackoffLimit: 10
spotNodeLabels:
  karpenter.sh/capacity-type: spot
  example.com/pool: [preemptible, spot]
namespaces:
  research:
    defaults:
      backoff-limit: 8
      error-propagation: none
    guardRails:
      maxBackoffLimit: 20
"""


def test_good_config_parses_into_annotation_values():
    config = parse_config(GOOD)
    assert config.defaults == {
        "fail-non-retriable": True,
        "retriable-exit-codes": (137, 143),
        "backoff-limit": 3,
        "ignore-disruptions": True,
        "non-spot-attempts": 1,
        "error-propagation": "Earliest",
    }
    assert config.guard_rails.max_backoff_limit == 10
    assert config.spot_node_labels == {
        "karpenter.sh/capacity-type": ("spot",),
        "example.com/pool": ("preemptible", "spot"),
    }
    assert config.rails("research").max_backoff_limit == 20
    assert config.rails("other").max_backoff_limit == 10
    layers = config.layers("research")
    assert [layer.source.value for layer in layers] == ["namespace default", "cluster default"]
    assert layers[0].values == {"backoff-limit": 8, "error-propagation": None}


def test_empty_and_missing_config_are_builtin_defaults():
    assert parse_config("").spot_node_labels == DEFAULT_SPOT_NODE_LABELS
    assert load_config(None).defaults == {}
    assert load_config(None).affects_unannotated("x") is False


def test_every_problem_is_listed_at_once(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        """
defaults:
  backof-limit: 3
  fail-non-retriable: yes-please
  retriable-exit-codes: [0]
  attempt: 2
guardRails:
  maxBackoffLimit: -1
  maxRetries: 3
spotNodeLabels:
  "not a key!": spot
  good.io/x: []
namespaces:
  Bad_NS: {}
  ok: {defaults: {backoff-limit: many}}
unexpected: 1
"""
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    wheres = [p.where for p in err.value.problems]
    assert wheres == [
        "unexpected",
        "defaults.backof-limit",
        "defaults.fail-non-retriable",
        "defaults.retriable-exit-codes",
        "defaults.attempt",
        "guardRails.maxRetries",
        "guardRails.maxBackoffLimit",
        "spotNodeLabels.not a key!",
        "spotNodeLabels.good.io/x",
        "namespaces.Bad_NS",
        "namespaces.ok.defaults.backoff-limit",
    ]
    text = str(err.value)
    assert "did you mean backoff-limit?" in text
    assert str(path) in text and "11 problem(s)" in text


def test_default_above_guard_rail_is_refused():
    with pytest.raises(ConfigError) as err:
        parse_config("defaults: {backoff-limit: 12}\nguardRails: {maxBackoffLimit: 10}\n")
    assert "above the guard rail maxBackoffLimit=10" in str(err.value)


def test_namespace_guard_rail_checks_inherited_default():
    with pytest.raises(ConfigError) as err:
        parse_config(
            "defaults: {backoff-limit: 5}\n"
            "namespaces: {strict: {guardRails: {maxBackoffLimit: 2}}}\n"
        )
    assert "namespace strict" in str(err.value)


def test_non_spot_default_needs_spot_labels():
    with pytest.raises(ConfigError) as err:
        parse_config("defaults: {non-spot-attempts: 1}\nspotNodeLabels: {}\n")
    assert "spotNodeLabels" in str(err.value)


def test_yaml_tags_that_construct_objects_are_refused():
    with pytest.raises(ConfigError) as err:
        parse_config("defaults: !!python/object/apply:os.system ['true']\n")
    assert "not valid YAML" in str(err.value)


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "missing.yaml")
    assert "cannot read" in str(err.value)


def test_top_level_must_be_mapping():
    with pytest.raises(ConfigError):
        parse_config("- a\n- b\n")


def test_affects_unannotated():
    assert parse_config("guardRails: {maxBackoffLimit: 3}").affects_unannotated(None)
    assert parse_config("namespaces: {a: {defaults: {backoff-limit: 1}}}").affects_unannotated("a")
    assert not parse_config("namespaces: {a: {defaults: {backoff-limit: 1}}}").affects_unannotated(
        "b"
    )
