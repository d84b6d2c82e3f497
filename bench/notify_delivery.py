"""Benchmark: 10,000 events to 100 webhook subscriptions against a local receiver.

    ./dev bench notify_delivery      (or: python bench/notify_delivery.py [--events N] [--subs N] [--threads N])

Sets up N subscriptions (one per experiment, webhooks to a loopback receiver,
coalescing off so every event is its own message) and inserts the events
(bulk, not measured), then measures, in this process:

* fan-out: ``notifications.services.fan_out`` of every event (outbox rows);
* delivery: ``notifications.services.deliver`` of every message from a pool of
  threads (each its own database connection): claim, sign, POST, record.

Prints wall time, messages/s and the delivery latency (event recorded ->
receiver got it) p50/p99. Target: 10,000 within 60 s. The Celery hop is not
measured (the tasks are called directly).
"""
from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _django import bench_database


def receiver() -> tuple[ThreadingHTTPServer, list[float]]:
    arrivals: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", "0")))
            arrivals.append(time.time())
            self.send_response(204)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, arrivals


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--subs", type=int, default=100)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    with bench_database():
        from django.conf import settings
        from django.db import connection
        from django.utils import timezone

        from notifications import services
        from notifications.models import Delivery, DeliveryAttempt, Event, EventType
        from tests import factories
        from xmc.auth.identity import Identity

        settings.XMC_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
        settings.XMC_NOTIFY_COALESCE_S = 0.0
        services.enqueue = lambda ids, countdown=None: None  # type: ignore[assignment]
        server, arrivals = receiver()
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        exps = [factories.experiment() for _ in range(args.subs)]
        for exp in exps:
            services.create(Identity(factories.ALICE), {"experiment": f"experiments/{exp.id}",
                                                        "events": ["WORK_UNIT_FAILED"], "webhook": {"url": url},
                                                        "rateLimitPerHour": 10_000})
        now = timezone.now()
        Event.objects.bulk_create([
            Event(key=f"bench/{i}", type=EventType.WORK_UNIT_FAILED, xid=exps[i % len(exps)].id, wid=i + 1, eid=1,
                  data={"state": "FAILED", "previousState": "RUNNING"}, create_time=now)
            for i in range(args.events)], batch_size=2000)
        ids = list(Event.objects.order_by("id").values_list("id", flat=True))
        start = time.time()
        for event_id in ids:
            services.fan_out(event_id)
        fanned = time.time()
        deliveries = list(Delivery.objects.order_by("id").values_list("id", flat=True))

        def send(chunk: list[int]) -> None:
            try:
                for did in chunk:
                    services.deliver(did)
            finally:
                connection.close()

        chunks = [deliveries[i::args.threads] for i in range(args.threads)]
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(send, chunks))
        done = time.time()
        server.shutdown()
        ok = DeliveryAttempt.objects.filter(ok=True).count()
        latencies = sorted(a - start for a in arrivals)
        def pct(p: float) -> float:
            return latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else float("nan")
        print(f"events {args.events}, subscriptions {args.subs}, messages {len(deliveries)}, delivered {ok}")
        print(f"fan-out   {fanned - start:7.2f} s  ({args.events / max(1e-9, fanned - start):,.0f} events/s)")
        print(f"delivery  {done - fanned:7.2f} s  ({ok / max(1e-9, done - fanned):,.0f} messages/s, "
              f"{args.threads} threads)")
        print(f"total     {done - start:7.2f} s  (target: 10,000 within 60 s)")
        print(f"latency from the start of the run: p50 {pct(0.5):.2f} s, p99 {pct(0.99):.2f} s")
        per_try = sorted(DeliveryAttempt.objects.values_list("latency_ms", flat=True))
        if per_try:
            print(f"one send (POST and answer): p50 {per_try[len(per_try) // 2]} ms, "
                  f"p99 {per_try[min(len(per_try) - 1, int(0.99 * len(per_try)))]} ms")


if __name__ == "__main__":
    main()
