"""Benchmark: the experiment page with 1,000 work units, and one change fanned out to 500 open streams.

    ./dev bench ui        (or: python bench/ui.py [--units 1000] [--subscribers 500] [--page-only])

On a throw-away database:

* **page**: server time of ``GET /experiments/<xid>`` for an experiment of
  ``--units`` work units (a sweep: one varying argument), through Django's
  test client in this process (no network), median and max of 10; the
  baseline in the same run is the API's ListWorkUnits of the same units over
  the same client (``/v1/experiments/<xid>/workUnits?pageSize=...``), and the
  ratio is printed. Target: <= 300 ms.
* **fan-out**: one web process (``gunicorn xmc.asgi:application``, one uvicorn
  worker) with ``--subscribers`` open event streams (raw asyncio sockets,
  bearer token), then ``ui.live.publish`` of a transition, as the reconciler's
  hook does, five times: the delay from publish to each stream's receipt
  (p50, p99, max), against one stream alone (the baseline, same run), and the
  worker's resident memory with the streams open. Targets: p99 <= 1 s, < 300 MiB.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse

from _django import ROOT, bench_database
from _signals import exit_on_termination


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


#: Work units made through the service; beyond, copies of the last one made in SQL (as the rows are).
BY_SERVICE = 1000


def copy_units(xid: int, units: int) -> None:
    """Work units BY_SERVICE+1 .. ``units``: copies in SQL of unit BY_SERVICE and its execution, each with its own
    ``lr`` and a state among RUNNING / COMPLETED / FAILED / SCHEDULING (the service path takes 30 ms a unit)."""
    from django.db import connection

    from workunits.services import argument_stats

    with connection.cursor() as cursor:
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'workunits_workunit' "
                       "AND column_name NOT IN ('id', 'wid', 'executable', 'args', 'arg_numbers')")
        unit_columns = [r[0] for r in cursor.fetchall()]
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = "
                       "'workunits_workunitexecution' AND column_name NOT IN ('id', 'work_unit_id', 'state')")
        ex_columns = [r[0] for r in cursor.fetchall()]
        u, e = ", ".join(unit_columns), ", ".join(ex_columns)
        te = ", ".join(f"t.{c}" for c in ex_columns)
        cursor.execute(
            f"INSERT INTO workunits_workunit (wid, executable, args, arg_numbers, {u}) SELECT g, "
            f"jsonb_set(w.executable, '{{jobset,jobs,0,spec,args,lr}}', to_jsonb((0.1 / g)::text)), "
            f"jsonb_set(w.args, '{{lr}}', to_jsonb((0.1 / g)::text)), "
            f"jsonb_set(w.arg_numbers, '{{lr}}', to_jsonb(0.1 / g)), {u} FROM workunits_workunit w, "
            f"generate_series(%s, %s) g WHERE w.experiment_id = %s AND w.wid = %s",
            [BY_SERVICE + 1, units, xid, BY_SERVICE])
        cursor.execute(
            f"INSERT INTO workunits_workunitexecution (work_unit_id, state, {e}) SELECT w.id, "
            f"(ARRAY['RUNNING', 'COMPLETED', 'FAILED', 'SCHEDULING'])[1 + w.wid %% 4], {te} "
            f"FROM workunits_workunit w, workunits_workunitexecution t JOIN workunits_workunit tw ON "
            f"tw.id = t.work_unit_id WHERE w.experiment_id = %s AND w.wid > %s AND tw.experiment_id = %s "
            f"AND tw.wid = %s", [xid, BY_SERVICE, xid, BY_SERVICE])
        argument_stats.refresh(xid)  # what the create path keeps for the copies' arguments
        cursor.execute("UPDATE experiments_experiment e SET child_state_counts = (SELECT jsonb_object_agg(s, n) FROM "
                       "(SELECT x.state AS s, count(*) AS n FROM workunits_workunitexecution x JOIN workunits_workunit w "
                       "ON w.id = x.work_unit_id WHERE w.experiment_id = %s GROUP BY x.state) c) WHERE e.id = %s",
                       [xid, xid])  # the roll-up the write path keeps
        # Each copy's own state on its row, as the write path keeps it (`WorkUnit.current_state`).
        cursor.execute(
            "UPDATE workunits_workunit w SET current_state = e.state, current_start = e.create_time, "
            "current_end = e.complete_time FROM workunits_workunitexecution e "
            "WHERE e.work_unit_id = w.id AND w.experiment_id = %s AND w.wid > %s", [xid, BY_SERVICE])
        cursor.execute("VACUUM ANALYZE workunits_workunit")  # what autovacuum does after a bulk insert
        cursor.execute("ANALYZE workunits_workunitexecution")


def page_bench(units: int) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from tests import factories
    from workunits import services
    from xmc.auth.tokens import issue_token

    User.objects.create_user("alice", factories.ALICE, "bench password 1234")
    exp = factories.experiment(title="bench sweep")
    started = time.monotonic()
    for i in range(min(units, BY_SERVICE)):
        message = factories.work_unit_message()
        message.executable.jobset.jobs[0].spec.args["lr"] = str(0.1 / (i + 1))
        message.executable.jobset.jobs[0].spec.args["batch"] = "64"
        services.create_work_unit(exp.id, message, work_unit_id=0)
    if units > BY_SERVICE:
        copy_units(exp.id, units)
    print(f"created {units} work units in {time.monotonic() - started:.1f} s", flush=True)
    client = Client()
    client.login(username="alice", password="bench password 1234")
    token = issue_token(factories.ALICE)

    def timed(get: object, n: int = 10) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            response = get()  # type: ignore[operator]
            out.append(time.perf_counter() - t)
            assert response.status_code == 200, response.status_code
        return out

    page_times = timed(lambda: client.get(f"/experiments/{exp.id}"))
    for label, query in (("sorted by state", "?sort=state"), ("sorted by lr, descending", "?sort=arg:lr&dir=desc"),
                         ("filtered state = FAILED", "?filter=state%20%3D%20FAILED"),
                         ("sorted by duration, page 500", "?sort=duration&page=500")):
        got = timed(lambda: client.get(f"/experiments/{exp.id}{query}"), n=5)
        print(f"  experiment page {label}: median {statistics.median(got) * 1000:.0f} ms, "
              f"max {max(got) * 1000:.0f} ms", flush=True)
    size = len(client.get(f"/experiments/{exp.id}").content)
    api_times = timed(lambda: client.get(f"/v1/experiments/{exp.id}/workUnits?pageSize={min(units, 1000)}",
                                         HTTP_AUTHORIZATION=f"Bearer {token}"))
    row_times = timed(lambda: client.get(f"/experiments/{exp.id}?fragment=row&wid=1&col=lr"))
    page, api, row = statistics.median(page_times), statistics.median(api_times), statistics.median(row_times)
    print(f"experiment page, {units} units ({size / 1024:.0f} KiB): median {page * 1000:.0f} ms, "
          f"max {max(page_times) * 1000:.0f} ms -> target <= 300 ms {'met' if page <= 0.3 else 'NOT met'}")
    print(f"  baseline ListWorkUnits of the same units: median {api * 1000:.0f} ms; page / API {page / api:.2f}x")
    print(f"  one row fragment (what an event re-fetches): median {row * 1000:.0f} ms")


async def _stream(port: int, path: str, token: str, ready: asyncio.Event, counter: list[int], want: int,
                  arrivals: dict[int, list[float]], index: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                 f"Accept: text/event-stream\r\n\r\n".encode())
    await writer.drain()
    hello = False
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            if line.startswith(b"event: hello") and not hello:
                hello = True
                counter[0] += 1
                if counter[0] == want:
                    ready.set()
            elif line.startswith(b"event: wu-1"):
                arrivals.setdefault(index, []).append(time.monotonic())
    finally:
        writer.close()


async def _fan_out(port: int, xid: int, token: str, subscribers: int, rounds: int,
                   worker: int) -> tuple[list[float], float]:
    from ui import live
    from workunits.hooks import Transition

    ready, counter, arrivals = asyncio.Event(), [0], {}  # type: ignore[var-annotated]
    tasks = [asyncio.create_task(_stream(port, f"/experiments/{xid}/events", token, ready, counter, subscribers,
                                         arrivals, i)) for i in range(subscribers)]
    await asyncio.wait_for(ready.wait(), timeout=120)
    delays: list[float] = []
    for r in range(rounds):
        before = {i: len(v) for i, v in arrivals.items()}
        sent = time.monotonic()
        await asyncio.to_thread(live.publish, [Transition(xid, 1, 1, "RUNNING", "RUNNING")])
        deadline = sent + 10
        while time.monotonic() < deadline and sum(len(v) - before.get(i, 0) for i, v in arrivals.items()) < subscribers:
            await asyncio.sleep(0.005)
        for i, times in arrivals.items():
            if len(times) > before.get(i, 0):
                delays.append(times[-1] - sent)
        missing = subscribers - sum(1 for i, v in arrivals.items() if len(v) > before.get(i, 0))
        if missing:
            print(f"  round {r + 1}: {missing} streams got nothing within 10 s")
        await asyncio.sleep(0.3)
    memory = rss_mib(worker)  # with every stream still open
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return delays, memory


def fan_out_bench(subscribers: int) -> None:
    from django.db import connection

    from tests import factories
    from xmc.auth.tokens import issue_token

    exp = factories.experiment(title="fan-out")
    factories.work_unit(exp)
    token = issue_token(factories.ALICE)
    db = connection.settings_dict
    url = urllib.parse.urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/xmc"))
    env = {**os.environ, "DATABASE_URL": urllib.parse.urlunsplit(url._replace(path="/" + db["NAME"])),
           "XMC_RATE_LIMIT_PER_S": "1000000", "XMC_RATE_LIMIT_BURST": "1000000", "XMC_LOG_LEVEL": "WARNING"}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "xmc.asgi:application", "-k",
                             "uvicorn_worker.UvicornWorker", "-b", f"127.0.0.1:{port}", "-w", "1",
                             "--log-level", "warning", "--backlog", "2048"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the web process did not start")
            time.sleep(0.2)
        import psutil

        worker = psutil.Process(proc.pid).children()[0].pid
        one, _ = asyncio.run(_fan_out(port, exp.id, token, 1, 5, worker))
        idle = rss_mib(worker)
        many, peak = asyncio.run(_fan_out(port, exp.id, token, subscribers, 5, worker))
        q = statistics.quantiles(many, n=100) if len(many) >= 2 else many * 99
        p50, p99 = statistics.median(many), q[98]
        base = statistics.median(one)
        print(f"fan-out to {subscribers} streams on one process, 5 changes: p50 {p50 * 1000:.0f} ms, "
              f"p99 {p99 * 1000:.0f} ms, max {max(many) * 1000:.0f} ms -> target p99 <= 1 s "
              f"{'met' if p99 <= 1.0 else 'NOT met'}")
        print(f"  baseline one stream: median {base * 1000:.1f} ms; {subscribers} streams p50 / one {p50 / base:.1f}x")
        print(f"  worker memory: {idle:.0f} MiB with one stream, {peak:.0f} MiB with {subscribers} open "
              f"-> target < 300 MiB {'met' if peak < 300 else 'NOT met'}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--subscribers", type=int, default=500)
    parser.add_argument("--page-only", action="store_true", help="only the page (e.g. --units 100000 --page-only)")
    args = parser.parse_args()
    exit_on_termination()  # SIGTERM stops what it starts (bench/_signals.py)
    with bench_database():
        page_bench(args.units)
        if not args.page_only:
            fan_out_bench(args.subscribers)


if __name__ == "__main__":
    main()
