"""``manage.py grpcserver [--port 50051] [--max-workers N] [--grace S] [--reuse-port]``: serve the gRPC API.

The process that real XManager clients talk to (``XMANAGER_ENDPOINT``). A
thin shell over `xmc.api.grpc_server.build_server`: bind, print the bound
address on stdout (``--port 0`` picks a free port, so scripts and tests read
the line), serve until SIGTERM/SIGINT, then stop gracefully (health reports
NOT_SERVING, running RPCs get ``--grace`` seconds).
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from xmc.api.grpc_server import build_server, serve_until_signalled
from xmc.checks import require_deploy_checks
from xmc.ops import serve_metrics


class Command(BaseCommand):
    help = "Serve cloud.xmanager.v1.ExperimentStateService, google.longrunning.Operations, health and reflection."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port", type=int, default=None, help="port to listen on (default XMC_GRPC_PORT; 0 picks a free one)"
        )
        parser.add_argument("--host", default="[::]", help="address to bind (default [::], every interface)")
        parser.add_argument(
            "--max-workers", type=int, default=None, help="handler threads (default XMC_GRPC_MAX_WORKERS)"
        )
        parser.add_argument("--grace", type=float, default=10.0, help="seconds running RPCs get on shutdown")
        parser.add_argument(
            "--metrics-port", type=int, default=0,
            help="serve Prometheus /metrics (RPCs by method and code, latencies) on this port (0: none)",
        )
        parser.add_argument(
            "--reuse-port",
            action="store_true",
            help="share the port with other grpcserver processes (SO_REUSEPORT), to use more than one core",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        port: int = settings.XMC_GRPC_PORT if options["port"] is None else options["port"]
        workers: int | None = options["max_workers"]
        if not 0 <= port <= 65535:
            raise CommandError("--port must be 0..65535")
        if workers is not None and workers < 1:
            raise CommandError("--max-workers must be at least 1")
        try:
            require_deploy_checks()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        try:
            server, bound = build_server(port, workers, host=options["host"], reuse_port=options["reuse_port"])
        except OSError as exc:
            raise CommandError(str(exc)) from exc
        if options["metrics_port"]:
            serve_metrics(options["metrics_port"])
        host = options["host"]
        self.stdout.write(f"gRPC server listening on {host}:{bound}")
        self.stdout.flush()
        serve_until_signalled(server, grace_s=options["grace"])
        self.stdout.write("gRPC server stopped")
