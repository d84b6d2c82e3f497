"""A real Prometheus scraping the cluster simulator's metrics endpoints (docs/architecture/system_metrics.md).

Debian's ``prometheus`` package (``/usr/bin/prometheus``; ``./dev`` installs it
when missing) stands in for a cluster's monitoring stack: `scripts/run_all.py`
starts it for ``./dev run`` and the tests start it against their simulator
(tests/metrics/prometheus.py). It scrapes the simulator's NVIDIA DCGM exporter
text (``/metrics/dcgm``) and cAdvisor text (``/metrics/cadvisor``); XMC reads it
back through the query API at ``XMC_PROMETHEUS_URL``.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlsplit

#: The scrape jobs: name and the simulator's path.
JOBS = (("dcgm-exporter", "/metrics/dcgm"), ("cadvisor", "/metrics/cadvisor"))


def binary() -> str | None:
    """The prometheus executable on PATH (or Debian's), None when it is not installed."""
    found = shutil.which("prometheus")
    if found:
        return found
    debian = Path("/usr/bin/prometheus")
    return str(debian) if debian.exists() else None


def config_text(simulator_url: str, *, scrape_interval_s: float = 15.0) -> str:
    """prometheus.yml scraping the simulator's endpoints every ``scrape_interval_s`` (JSON is YAML)."""
    target = urlsplit(simulator_url).netloc
    interval = f"{max(1, round(scrape_interval_s * 1000))}ms"
    jobs = ",".join(
        f'{{"job_name":"{name}","metrics_path":"{path}","honor_labels":true,"scrape_interval":"{interval}",'
        f'"scrape_timeout":"{interval}","static_configs":[{{"targets":["{target}"]}}]}}'
        for name, path in JOBS)
    return f'{{"global":{{"scrape_interval":"{interval}","evaluation_interval":"{interval}"}},"scrape_configs":[{jobs}]}}\n'


def argv(executable: str, config: Path, data_dir: Path, port: int) -> list[str]:
    """The command line: its own port and data folder, a short retention (a local run's history)."""
    return [executable, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=7d", "--log.level=warn"]
