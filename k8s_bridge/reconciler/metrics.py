"""Prometheus metrics of the reconciler (served by ``manage.py reconcile --metrics-port``).

One module owns every metric so the names stay consistent; the batcher,
the watchers and the controller increment them.
"""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

EVENTS = Counter("xmc_reconciler_events_total", "Watch events seen", ["kind", "type"])
RELISTS = Counter("xmc_reconciler_relists_total", "Full lists (start, 410 Gone, periodic resync)", ["kind", "reason"])
FLUSHES = Counter("xmc_reconciler_flushes_total", "Batcher flushes by result", ["result"])
BATCH_SIZE = Histogram("xmc_reconciler_batch_size", "Updates per flush",
                       buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000))
WRITE_SECONDS = Histogram("xmc_reconciler_write_seconds", "update_work_unit_executions latency per flush",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
OUTCOMES = Counter("xmc_reconciler_update_outcomes_total",
                   "Guard outcome of each state-bearing update (applied, unchanged, fenced, stale, invalid)",
                   ["outcome"])
DROPPED = Counter("xmc_reconciler_dropped_updates_total", "Updates dropped because the service rejected them")
LAG_SECONDS = Histogram("xmc_reconciler_lag_seconds", "Watch event seen -> update committed",
                        buckets=(0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30))
PENDING = Gauge("xmc_reconciler_pending_slots", "Updates waiting in the batcher")
LEADER = Gauge("xmc_reconciler_leader", "1 while this process holds the reconciler lease")
FINALIZERS = Counter("xmc_reconciler_finalizers_removed_total", "Finalizers removed, by why", ["why"])
SWEEP = Counter("xmc_reconciler_orphans_total", "Orphan sweep repairs", ["case"])


def serve(port: int, addr: str = "127.0.0.1") -> int:
    """Start the metrics HTTP endpoint; returns the bound port (``0`` picks a free one)."""
    server, _thread = start_http_server(port, addr=addr)
    return int(server.server_port)
