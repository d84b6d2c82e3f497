"""Benchmark: 10,000 events to 100 webhook subscriptions against a local receiver.

    ./dev bench notify_delivery      (or: python bench/notify_delivery.py [--events N] [--subs N] [--processes N] [--send-concurrency N] [--batch N])

Sets up N subscriptions (one per experiment, webhooks to a loopback receiver,
coalescing off so every event is its own message) and inserts the events
(bulk, not measured), then measures, in this process:

* fan-out: the ``notifications.tasks.fan_out`` task's body of the events in
  batches of ``--batch`` (what one fan-out task carries: the events of one
  committed group of transitions): claimed through
  ``delivery.consume.consume_many``, then ``notifications.services.fan_out_many``
  writes the outbox rows;
* delivery: the ``notifications.tasks.deliver`` task's body over batches of
  ``DELIVER_BATCH`` messages (what one deliver task carries) from
  ``--processes`` worker processes (default: one per core, as a Celery
  prefork worker runs), each batch claimed in one statement
  (``delivery.leases.claim_many``), checked and moved to DELIVERING in one
  transaction, sent ``XMC_NOTIFY_SEND_CONCURRENCY`` at a time and recorded
  in one statement.

``--direct`` calls ``notifications.services.fan_out_many`` / ``deliver_many``
instead of the tasks' bodies (no claim through the delivery floor).

Prints wall time, messages/s and the delivery latency (event recorded ->
receiver got it) p50/p99. Target: 10,000 within 60 s. The Celery hop is not
measured (the tasks are called directly). Baseline, measured in the same run:
the same number of signed POSTs to the same receiver from the same threads
with no database at all; the ratio says what the outbox costs on top of the
network.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _django import bench_database
from _signals import exit_on_termination


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

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # the default backlog of 5 resets connections under 16 senders

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, arrivals


def deliver_part(ids: list[int], direct: bool) -> None:
    """One worker process: deliver ``ids`` a task's batch at a time."""
    from django.db import connection

    from notifications import services, tasks

    deliver = services.deliver_many if direct else tasks.deliver.run
    try:
        for start in range(0, len(ids), services.DELIVER_BATCH):
            deliver(ids[start:start + services.DELIVER_BATCH])
    finally:
        connection.close()


def baseline(url: str, count: int, threads: int) -> float:
    """Seconds for ``count`` signed POSTs of a typical body from ``threads`` threads, no database."""
    import base64
    import uuid

    import requests

    from notifications import signing

    secret = "whsec_" + base64.b64encode(b"b" * 32).decode()
    body = '{"type":"workUnit.failed","timestamp":"2026-12-01T00:00:00Z","data":{"experiment":"experiments/1"}}'

    def post(n: int) -> None:
        for _ in range(n):  # one connection per message, as the webhook adapter does
            mid, ts = f"msg_{uuid.uuid4().hex}", int(time.time())
            headers = {"content-type": "application/json", **signing.headers([secret], mid, ts, body)}
            requests.post(url, data=body.encode(), headers=headers, timeout=10,
                          allow_redirects=False).raise_for_status()

    started = time.time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(post, [count // threads + (1 if i < count % threads else 0) for i in range(threads)]))
    return time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--subs", type=int, default=100)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--send-concurrency", type=int, default=None,
                        help="XMC_NOTIFY_SEND_CONCURRENCY (default: the setting's)")
    parser.add_argument("--batch", type=int, default=50, help="events per fan-out task")
    parser.add_argument("--direct", action="store_true",
                        help="call the services, not the tasks' bodies (no claim through consume_many)")
    args = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)
    with bench_database():
        from django.conf import settings
        from django.db import connections
        from django.utils import timezone

        from notifications import services, tasks
        from notifications.models import Delivery, DeliveryAttempt, Event, EventType
        from tests import factories
        from xmc.auth.identity import Identity

        settings.XMC_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
        settings.XMC_NOTIFY_COALESCE_S = 0.0
        if args.send_concurrency is not None:
            settings.XMC_NOTIFY_SEND_CONCURRENCY = args.send_concurrency
        width = settings.XMC_NOTIFY_SEND_CONCURRENCY
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
        fan_out = services.fan_out_many if args.direct else tasks.fan_out.run
        for i in range(0, len(ids), args.batch):
            fan_out(ids[i:i + args.batch])
        fanned = time.time()
        deliveries = list(Delivery.objects.order_by("id").values_list("id", flat=True))

        connections.close_all()  # the children open their own
        children = [multiprocessing.get_context("fork").Process(target=deliver_part, daemon=True,  # ended with us
                                                                args=(deliveries[i::args.processes], args.direct))
                    for i in range(args.processes)]
        for child in children:
            child.start()
        for child in children:
            child.join()
        done = time.time()
        arrivals = list(arrivals)  # ours only: the baseline's POSTs reach the same receiver
        baseline_s = baseline(url, len(deliveries), args.processes * width)
        server.shutdown()
        ok = DeliveryAttempt.objects.filter(ok=True).count()
        latencies = sorted(a - start for a in arrivals)
        def pct(p: float) -> float:
            return latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else float("nan")
        print(f"events {args.events}, subscriptions {args.subs}, messages {len(deliveries)}, delivered {ok}")
        print(f"fan-out   {fanned - start:7.2f} s  ({args.events / max(1e-9, fanned - start):,.0f} events/s)")
        print(f"delivery  {done - fanned:7.2f} s  ({ok / max(1e-9, done - fanned):,.0f} messages/s, "
              f"{args.processes} processes, batches of {services.DELIVER_BATCH}, {width} sends at a time)")
        print(f"total     {done - start:7.2f} s  (target: 10,000 within 60 s)")
        print(f"baseline  {baseline_s:7.2f} s  (the same signed POSTs, no database: "
              f"{len(deliveries) / max(1e-9, baseline_s):,.0f} messages/s); "
              f"ratio total/baseline {(done - start) / max(1e-9, baseline_s):.2f}x")
        print(f"latency from the start of the run: p50 {pct(0.5):.2f} s, p99 {pct(0.99):.2f} s")
        per_try = sorted(DeliveryAttempt.objects.values_list("latency_ms", flat=True))
        if per_try:
            print(f"one send (POST and answer): p50 {per_try[len(per_try) // 2]} ms, "
                  f"p99 {per_try[min(len(per_try) - 1, int(0.99 * len(per_try)))]} ms")


if __name__ == "__main__":
    main()
