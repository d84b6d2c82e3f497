"""A PromQL client for any Prometheus-compatible query API (docs/architecture/system_metrics.md).

Plain HTTP (``requests``): ``POST {XMC_PROMETHEUS_URL}/api/v1/query`` with the
query and an evaluation time, as Prometheus documents it
(https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries) and
Google Managed Prometheus, Thanos and VictoriaMetrics serve it. Only instant
vectors are read; each sample is its labels and value.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import requests


class PrometheusError(Exception):
    """The query API could not be reached or refused the query (the message says which)."""


class Sample(NamedTuple):
    labels: dict[str, str]
    value: float


def query(url: str, promql: str, *, at: float | None = None, timeout: float = 10.0,
          session: requests.Session | None = None) -> list[Sample]:
    """The instant vector ``promql`` evaluates to at unix time ``at`` (None: the server's now)."""
    data: dict[str, Any] = {"query": promql}
    if at is not None:
        data["time"] = f"{at:.3f}"
    try:
        response = (session or requests).post(f"{url.rstrip('/')}/api/v1/query", data=data, timeout=timeout)
    except requests.RequestException as exc:
        raise PrometheusError(f"{url}: {exc}") from exc
    try:
        body = response.json()
    except ValueError:
        raise PrometheusError(f"{url}: HTTP {response.status_code}, not JSON") from None
    if response.status_code != 200 or body.get("status") != "success":
        raise PrometheusError(f"{url}: HTTP {response.status_code}: {body.get('errorType', '')} {body.get('error', '')}")
    result = body.get("data") or {}
    if result.get("resultType") != "vector":
        raise PrometheusError(f"{url}: {promql!r} is a {result.get('resultType')}, not an instant vector")
    out = []
    for item in result.get("result") or ():
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            out.append(Sample(dict(item.get("metric") or {}), value))
    return out
