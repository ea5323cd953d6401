"""Kubernetes resource quantities (``2Gi``, ``1500M``, ``1.5e9``): parse, compare, format.

Parsing follows ``ParseQuantity`` in k8s.io/apimachinery/pkg/api/resource/quantity.go: an
optional sign, digits with an optional decimal point (``1.``, ``.5``), then a suffix that
is binary (``Ki``..``Ei``), decimal (``n``, ``u``, ``m``, none, ``k``, ``M``..``E``) or an
exponent (``e3``, ``E-2``); a value is rounded up (away from zero) to a billionth, as the
API server stores it. Values are exact fractions, never floats.

Formatting gives the canonical form the API server stores and returns
(``CanonicalizeBytes``): a binary quantity is written with the largest binary suffix
that keeps it whole (``1.5Gi`` is ``1536Mi``), one below 1024 or with a fraction in
decimal; a decimal one with an exponent that is a multiple of three and no fractional
digits (``1.5`` is ``1500m``). So what the webhook writes is what ``kubectl get`` shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from math import ceil

BINARY = "BinarySI"
DECIMAL = "DecimalSI"
EXPONENT = "DecimalExponent"

_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12}
_DECIMAL_SUFFIXES.update({"P": 15, "E": 18})
_DECIMAL_BY_EXPONENT = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_EXPONENT = {e: s for s, e in _BINARY_SUFFIXES.items()}
#: A sign, digits, an optional fraction, then what ``parseQuantityString`` takes for a
#: suffix: letters of the suffixes, an optional sign, digits.
_SCAN = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*(?:[+-]?[0-9]*))")
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")
#: Exponents beyond this are refused here (the API server wraps them at 32 bits).
_MAX_EXPONENT = 100
_NANO = Fraction(1, 10**9)
#: The largest quantity the API server keeps exactly (larger binary ones are capped).
MAX_VALUE = 2**63 - 1


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity."""


@dataclass(frozen=True)
class Quantity:
    """An exact value and the format it is written back in."""

    value: Fraction
    format: str = DECIMAL

    def __str__(self) -> str:
        return canonical(self.value, self.format)

    def with_value(self, value: Fraction) -> Quantity:
        return Quantity(value, self.format)


def parse(text: str) -> Quantity:
    """``text`` as a quantity; raises ``QuantityError`` when it is not one.

    Scans as ``parseQuantityString`` does, which is more lenient than the documented
    grammar: the number may be empty (``Ki`` and ``.`` are zero), ``1.`` and ``.5`` are
    numbers, and an exponent may carry a sign (``1e-3``, ``1E+3``)."""
    if not isinstance(text, str) or not text or not text.isascii():
        raise QuantityError("not a quantity")
    match = _SCAN.fullmatch(text)
    if match is None:
        raise QuantityError("not a quantity")
    sign, whole, fraction, suffix = match.groups()
    fraction = fraction or ""
    digits = Fraction(int(whole or "0"))
    if fraction:
        digits += Fraction(int(fraction), 10 ** len(fraction))
    if suffix in _DECIMAL_SUFFIXES:
        value, form = digits * Fraction(10) ** _DECIMAL_SUFFIXES[suffix], DECIMAL
    elif suffix in _BINARY_SUFFIXES:
        value, form = digits * 2 ** _BINARY_SUFFIXES[suffix], BINARY
    else:
        exponent = _EXPONENT.fullmatch(suffix)
        if exponent is None:
            raise QuantityError("unknown suffix")
        if abs(int(exponent.group(1))) > _MAX_EXPONENT:
            raise QuantityError("exponent too large")
        value, form = digits * Fraction(10) ** int(exponent.group(1)), EXPONENT
    value = _round_up_to_nano(value)
    if form == BINARY and value > MAX_VALUE:
        value = Fraction(MAX_VALUE)
    if form == BINARY and 0 < value < 1:
        form = DECIMAL  # (as ParseQuantity does)
    return Quantity(-value if sign == "-" and value else value, form)


def _round_up_to_nano(value: Fraction) -> Fraction:
    scaled = value / _NANO
    if scaled.denominator == 1:
        return value
    return Fraction(ceil(scaled)) * _NANO


def canonical(value: Fraction, form: str = DECIMAL) -> str:
    """``value`` in the API server's canonical form for ``form``."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    if form == BINARY and magnitude >= 1024 and magnitude.denominator == 1:
        mantissa, exponent = int(magnitude), 0
        while mantissa % 1024 == 0 and exponent < 60:
            mantissa //= 1024
            exponent += 10
        return f"{sign}{mantissa}{_BINARY_BY_EXPONENT.get(exponent, '')}"
    mantissa, exponent = _decimal(magnitude)
    if form == EXPONENT:
        return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{mantissa}{_DECIMAL_BY_EXPONENT.get(exponent, '')}"


def _decimal(magnitude: Fraction) -> tuple[int, int]:
    """``magnitude`` = mantissa x 10^exponent, exponent a multiple of 3, the mantissa as
    small as that allows (``AsCanonicalBytes``)."""
    exponent = 0
    while magnitude.denominator != 1:
        magnitude *= 10
        exponent -= 1
    mantissa = int(magnitude)
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    return mantissa, exponent


def scaled(quantity: Quantity, factor: Fraction, granularity: bool = True) -> Fraction:
    """``quantity`` times ``factor``, rounded up: to whole bytes, and with ``granularity``
    to a whole Mi (binary quantities) or M (others) once it is that large, so a raised
    memory reads ``1332Mi`` rather than ``1395864372``."""
    value = quantity.value * factor
    unit = Fraction(2**20) if quantity.format == BINARY else Fraction(10**6)
    step = unit if granularity and value >= unit else Fraction(1)
    return Fraction(ceil(value / step)) * step
