"""The actuator: turns committed operations into JobSets, exactly once in effect.

``k8s_bridge.tasks`` holds the thin Celery tasks (``xmc.actuator.create``,
``delete``, ``restart``, ``update``); ``runner`` verifies and runs one task,
classifies failures (``k8s_bridge.errors``), retries or dead-letters;
``handlers`` re-read the world and act; ``preconditions`` are the pure rules
of STATES.md ("Actuator preconditions"); ``pause`` holds tasks back while
scheduling is paused. See docs/architecture/actuator.md.
"""
