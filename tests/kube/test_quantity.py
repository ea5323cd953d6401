"""Kubernetes quantities (webhook/kube/quantity.py) against the real parser.

The oracle is ``ParseQuantity`` of k8s.io/apimachinery, run by the real kubectl:
``kubectl set resources --local`` parses every ``--requests`` value with it and prints
the Quantity back (its canonical form, or the text itself when ParseQuantity keeps it).
Strings are generated from the quantity grammar (and from its alphabet, for the ones
that are not quantities), and each must be accepted or refused as kubectl does, with
the same value; what the webhook writes must come back from kubectl unchanged.
"""

from __future__ import annotations

import json
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.servers import scaled
from testkit.tools import tool
from webhook.kube import quantity
from webhook.kube.quantity import (
    BINARY,
    DECIMAL,
    EXPONENT,
    Quantity,
    QuantityError,
    canonical,
    parse,
)

BINARY_SUFFIXES = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
DECIMAL_SUFFIXES = ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"]


def kubectl_values(values: list[str], tmp: Path) -> list[str | None]:
    """What ParseQuantity makes of each value (its printed form), ``None`` when it refuses
    one: all in one kubectl call, split in halves to find the refused ones."""
    if not values:
        return []
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "q"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    source = tmp / "pod.json"
    source.write_text(json.dumps(pod))
    requests = ",".join(f"example.com/q{i}={v}" for i, v in enumerate(values))
    argv = [tool("kubectl"), "set", "resources", "--local", "-f", str(source)]
    result = subprocess.run(
        [*argv, f"--requests={requests}", "-o", "json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp)},
        timeout=scaled(60),
        check=False,
    )
    if result.returncode == 0:
        out = json.loads(result.stdout)["spec"]["containers"][0]["resources"]["requests"]
        return [out[f"example.com/q{i}"] for i in range(len(values))]
    if len(values) == 1:
        assert "quantit" in result.stderr or "suffix" in result.stderr, result.stderr
        return [None]
    half = len(values) // 2
    return kubectl_values(values[:half], tmp) + kubectl_values(values[half:], tmp)


digits = st.text("0123456789", max_size=12)
suffixes = st.one_of(
    st.sampled_from(BINARY_SUFFIXES + DECIMAL_SUFFIXES),
    st.builds(
        lambda e, sign, n: f"{e}{sign}{n}",
        st.sampled_from("eE"),
        st.sampled_from(["", "+", "-"]),
        st.integers(0, 30),
    ),
)
grammar = st.builds(
    lambda sign, whole, point, fraction, suffix: f"{sign}{whole}{point}{fraction}{suffix}",
    st.sampled_from(["", "", "+", "-"]),
    digits,
    st.sampled_from(["", "."]),
    st.text("0123456789", max_size=10),
    suffixes,
).filter(lambda s: bool(s) and "," not in s)
# Near-quantities: the grammar's alphabet in any order (mostly not quantities).
noise = st.text("0123456789.+-eEinumkKMGTPi", min_size=1, max_size=8)


@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(grammar, min_size=300, max_size=300), st.lists(noise, min_size=150, max_size=150))
def test_parse_accepts_and_values_as_parsequantity_does(tmp_path_factory, valid, other):
    # upstream: ParseQuantity and parseQuantityString in
    # k8s.io/apimachinery/pkg/api/resource/quantity.go (through kubectl set resources)
    tmp = tmp_path_factory.mktemp("quantity")
    values = valid + other
    printed = kubectl_values(values, tmp)
    for text, theirs in zip(values, printed, strict=True):
        try:
            ours = parse(text)
        except QuantityError:
            assert theirs is None, f"{text!r}: kubectl accepts it as {theirs!r}"
            continue
        assert theirs is not None, f"{text!r}: kubectl refuses it, we read {ours}"
        assert parse(theirs).value == ours.value, (text, theirs, ours)


@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(
            st.fractions(min_value=0, max_value=2**62, max_denominator=10**9),
            st.sampled_from([BINARY, DECIMAL, EXPONENT]),
        ),
        min_size=200,
        max_size=200,
    )
)
def test_what_we_write_comes_back_unchanged(tmp_path_factory, values):
    # upstream: CanonicalizeBytes (quantity.go) prints what ParseQuantity reads back
    tmp = tmp_path_factory.mktemp("canonical")
    # Values as the API server keeps them: whole billionths.
    written = [canonical(quantity._round_up_to_nano(v), form) for v, form in values]
    assert kubectl_values(written, tmp) == written


@pytest.mark.parametrize(
    ("text", "value", "form"),
    [
        ("2Gi", 2 * 2**30, BINARY),
        ("1.5Gi", 3 * 2**29, BINARY),
        ("1500M", 1_500_000_000, DECIMAL),
        ("12e6", 12_000_000, EXPONENT),
        ("1E+3", 1000, EXPONENT),
        ("100m", Fraction(1, 10), DECIMAL),
        ("0.5Ki", 512, BINARY),  # binary, but written as 512 (below 1Ki)
        ("0.1n", Fraction(1, 10**9), DECIMAL),  # rounded up to a billionth
        ("-1.5", Fraction(-3, 2), DECIMAL),
        ("Ki", 0, BINARY),  # no digits: zero, as ParseQuantity reads it
        (".5", Fraction(1, 2), DECIMAL),
        ("1.", 1, DECIMAL),
        ("10Ei", 2**63 - 1, BINARY),  # capped
    ],
)
def test_parse_examples(text, value, form):
    parsed = parse(text)
    assert parsed.value == value
    assert parsed.format == form


@pytest.mark.parametrize(
    "text", ["", "1Ki ", "1KiB", "1K", "1e", "1e+", "1.5.5", "1e3.5", "\uff11", "0x10"]
)
def test_not_quantities(text):
    with pytest.raises(QuantityError):
        parse(text)


def test_canonical_forms():
    assert str(parse("1.5Gi")) == "1536Mi"
    assert str(parse("1.5")) == "1500m"
    assert str(parse("2048Mi")) == "2Gi"
    assert str(parse("1e19")) == "10e18"
    assert str(parse("1000Mi")) == "1000Mi"
    assert str(parse("1023.5Ki")) == "1048064"
    assert str(parse("0.5Ki")) == "512"
    assert str(parse("0.0001Ki")) == "102400u"  # below 1 byte: decimal


def test_scaled_rounds_up_to_a_whole_unit_of_the_quantitys_kind():
    two_gi = parse("2Gi")
    assert str(Quantity(quantity.scaled(two_gi, Fraction(3, 2)), BINARY)) == "3Gi"
    # 1Gi x 1.3 = 1331.2Mi: rounded up to whole Mi, never down
    assert str(two_gi.with_value(quantity.scaled(parse("1Gi"), Fraction(13, 10)))) == "1332Mi"
    assert quantity.scaled(parse("1500M"), Fraction(3, 2)) == 2_250_000_000
    assert quantity.scaled(parse("100"), Fraction(3, 2)) == 150  # small: whole bytes
