"""``python -m simulators.cluster``: run the cluster simulator in the foreground.

Starts the store, the HTTP API server and the simulated controllers through
`simulators.cluster.server.run_simulator`, writes a kubeconfig any client can
use, restores and periodically saves ``--state-file``, and shuts down cleanly
(state saved) on SIGTERM/SIGINT. Used by ``./dev run`` and by developers; tests
call `run_simulator` in-process instead.
"""
from __future__ import annotations

import argparse

from simulators.cluster.server import ControllersUnavailable, run_simulator
from simulators.serving import fail, serve_until_signal


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m simulators.cluster",
        description="Run the local Kubernetes simulator (API server + JobSet/Kueue/kubelet controllers).")
    parser.add_argument("--port", type=int, default=6443, help="listen port (0 = pick a free one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--kubeconfig-out", default=None, help="write a kubeconfig for this simulator here")
    parser.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second")
    parser.add_argument("--state-file", default=None, help="restore from / persist to this JSON file")
    parser.add_argument("--queues-config", default=None, help="YAML seeding flavors and queues")
    parser.add_argument("--save-interval", type=float, default=10.0, help="seconds between state saves")
    parser.add_argument("--no-controllers", action="store_true", help="serve the API only")
    parser.add_argument("--faults", default=None,
                        help="JSON/YAML file of injected API faults (simulators.cluster.faults; also /sim/faults)")
    options = parser.parse_args(argv)
    try:
        handle = run_simulator(
            port=options.port,
            host=options.host,
            speed=options.speed,
            state_file=options.state_file,
            queues_config=options.queues_config,
            kubeconfig_out=options.kubeconfig_out,
            controllers=not options.no_controllers,
            save_interval_s=options.save_interval,
            faults=options.faults,
        )
    except ControllersUnavailable as exc:
        fail(f"simcluster: {exc}. Use --no-controllers to run the API server alone.")
        return
    except (ValueError, TypeError, FileNotFoundError) as exc:
        fail(f"simcluster: --faults {options.faults}: {exc}")
        return
    except OSError as exc:
        fail(f"simcluster: cannot listen on {options.host}:{options.port}: {exc}")
        return

    def stop() -> str:
        handle.stop()
        return "stopped" + (f", state saved to {handle.state_file}" if handle.state_file else "")

    serve_until_signal("simcluster", handle.url + (f", kubeconfig {handle.kubeconfig_path}"
                                                  if handle.kubeconfig_path else ""), stop)


if __name__ == "__main__":
    main()
