"""Kubernetes resource quantities ("500m", "16Gi", "2", "1e3") as exact fractions.

Used by the simulated Kueue (`simulators.cluster.controllers.kueue`) to add pod
requests, compare them with ClusterQueue quota and write `resourceUsage` /
`flavorsUsage` back in canonical-looking form.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
            "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
            "P": Fraction(10**15), "E": Fraction(10**18)}
_QTY = re.compile(r"^([+-]?[0-9.]+)(?:[eE]([+-]?\d+))?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(value: object) -> Fraction:
    """Exact value of a quantity string or number; ValueError when malformed."""
    if isinstance(value, (int, float)):
        return Fraction(value).limit_denominator(10**9)
    text = str(value).strip()
    m = _QTY.match(text)
    if not m:
        raise ValueError(f"invalid quantity {value!r}")
    number = Fraction(m.group(1))
    if m.group(2):
        number *= Fraction(10) ** int(m.group(2))
    suffix = m.group(3) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    return number * _DECIMAL[suffix]


def format_quantity(value: Fraction, resource: str = "") -> str:
    """Canonical-looking text: "500m", "4", "16Gi", "1500M"."""
    if value.denominator != 1:
        millis = value * 1000
        if millis.denominator == 1:
            return f"{millis.numerator}m"
        return f"{int(millis)}m"
    n = value.numerator
    if n != 0 and (resource == "memory" or resource.endswith("storage")):
        for suffix, mult in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
            if n % mult == 0:
                return f"{n // mult}{suffix}"
    return str(n)
