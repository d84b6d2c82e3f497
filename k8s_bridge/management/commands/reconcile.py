"""`manage.py reconcile [--namespace NS]... [--once]`: the reconciler process.

A thin loop (``k8s_bridge.reconciler``): campaign for the leader Lease; while
leading, run a :class:`~k8s_bridge.reconciler.controller.Reconciler`; when the
lease is lost, drop what is pending and campaign again; on SIGTERM/SIGINT let
the current flush finish, write what is pending, release the lease and exit.
``--once`` lists everything, reconciles and sweeps once, flushes and exits
without taking part in the election (an operator's repair tool; do not run
it next to a leader).
"""
from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from core.signals import stop_event
from k8s_bridge.reconciler import metrics
from k8s_bridge.reconciler.controller import Options, Reconciler
from k8s_bridge.reconciler.leader import LeaderElector
from xmc.checks import require_supported_services

LEASE_NAME = "xmc-reconciler"


class Command(BaseCommand):
    help = "Watch JobSets, Workloads and Pods and keep every execution's state true."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--namespace", action="append", default=[], dest="namespaces",
                            help="namespace to watch (repeatable; default XMC_K8S_NAMESPACE)")
        parser.add_argument("--once", action="store_true", help="reconcile and sweep once, then exit")
        parser.add_argument("--metrics-port", type=int, default=settings.XMC_RECONCILER_METRICS_PORT,
                            help="Prometheus port (0 = a free port, -1 = off)")
        parser.add_argument("--identity", default="", help="leader-election identity (default host-pid-random)")
        parser.add_argument("--lease-duration", type=float, default=settings.XMC_RECONCILER_LEASE_DURATION_S)

    def handle(self, *args: Any, **options: Any) -> None:
        require_supported_services()
        opts = Options.from_settings(options["namespaces"])
        if options["once"]:
            repairs = Reconciler(opts).run_once()
            self.stdout.write(f"reconcile: done once ({len(repairs)} orphan repair(s))")
            return
        if options["metrics_port"] >= 0:
            try:
                port = metrics.serve(options["metrics_port"])
                self.stdout.write(f"reconcile: metrics on http://127.0.0.1:{port}/metrics")
            except OSError as exc:
                self.stderr.write(f"reconcile: metrics port {options['metrics_port']} unavailable: {exc}")
        identity = options["identity"] or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        lost = threading.Event()
        with stop_event() as stop:
            elector = LeaderElector(opts.namespaces[0], LEASE_NAME, identity,
                                    lease_duration_s=options["lease_duration"], on_lost=lost.set)
            elector.start()
            self.stdout.write(f"reconcile: {identity} watching {', '.join(opts.namespaces)}")
            self.stdout.flush()
            try:
                while not stop.is_set():
                    if not elector.is_leader():
                        stop.wait(0.1)
                        continue
                    lost.clear()
                    self.stdout.write(f"reconcile: {identity} is the leader")
                    self.stdout.flush()
                    reconciler = Reconciler(opts, can_write=elector.is_leader)
                    reconciler.start()
                    while not stop.is_set() and not lost.is_set() and elector.is_leader():
                        stop.wait(0.1)
                    leading = elector.is_leader()
                    reconciler.stop(drain=leading)
                    if not leading:
                        self.stdout.write(f"reconcile: {identity} lost the lease; standing by")
                        self.stdout.flush()
            finally:
                elector.release()
        self.stdout.write("reconcile: stopped")
