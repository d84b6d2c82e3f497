"""Metrics: points written by running jobs, charts over them, dashboards of charts.

Beside ``artifacts`` on the floors (``.importlinter``): it uses ``workunits``,
``experiments`` and ``core``; the API layer (``xmc.api.dashboards``,
``xmc.api.metrics_write``) serves it, and the actuator asks it for each
execution's metrics environment (`metrics.tokens.execution_env`).
See docs/architecture/metrics.md.
"""
