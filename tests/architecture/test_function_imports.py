"""Imports of our own modules sit at the top of a module, except the documented few.

An import inside a function hides an arrow from import-linter and usually
papers over a circle. The only ones allowed are listed here, each with its
reason: Django's app registry (``AppConfig.ready`` and what runs before the
apps are loaded) and the simulator's optional controllers. A new one fails
this test until it is either moved to the top or added here with a reason.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.architecture.production import parse

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "delivery", "jobsets", "xmc", "experiments", "workunits", "artifacts", "metrics", "lifecycle", "studies", "k8s_bridge", "notifications", "usage", "ui", "simulators")

#: (file, function, imported module) -> why it cannot be at the top.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("k8s_bridge/apps.py", "ready", "k8s_bridge.logs"): "app registry: the logs view imports models",
    ("k8s_bridge/apps.py", "ready", "xmc.api"): "app registry: registers the logs endpoint into xmc.api.extensions",
    ("k8s_bridge/apps.py", "ready", "k8s_bridge.queues"): "app registry: the queues view imports models",
    ("usage/apps.py", "ready", "usage"): "app registry: the usage view imports models",
    ("usage/apps.py", "ready", "xmc.api"): "app registry: registers GET /v1/usage into xmc.api.extensions",
    ("k8s_bridge/apps.py", "ready", "workunits"): "app registry: registers the termination provider into workunits.hooks",
    ("workunits/apps.py", "ready", "workunits"): "app registry: registers its outboxes into delivery.sweep (they import models)",
    ("lifecycle/apps.py", "ready", "artifacts"): "app registry: registers into artifacts.hooks once the apps are loaded",
    ("lifecycle/apps.py", "ready", "lifecycle"): "app registry: services and stamping import models",
    ("lifecycle/apps.py", "ready", "workunits"): "app registry: registers into workunits.hooks once the apps are loaded",
    ("lifecycle/apps.py", "check_lifecycle_configuration", "lifecycle"): "app registry: rules imports models",
    ("notifications/apps.py", "ready", "notifications"): "app registry: sources imports models",
    ("notifications/apps.py", "ready", "xmc.api"): "app registry: registers the REST endpoints into xmc.api.extensions",
    ("notifications/apps.py", "ready", "workunits"): "app registry: registers into workunits.hooks once the apps are loaded",
    ("studies/apps.py", "ready", "metrics"): "app registry: registers into metrics.hooks once the apps are loaded",
    ("studies/apps.py", "ready", "studies"): "app registry: the controller imports models",
    ("studies/apps.py", "ready", "workunits"): "app registry: registers into workunits.hooks once the apps are loaded",
    ("ui/apps.py", "ready", "ui"): "app registry: the URLconf's views import models",
    ("ui/apps.py", "ready", "xmc.api"): "app registry: registers the pages and their event paths into xmc.api.extensions",
    ("ui/apps.py", "ready", "workunits"): "app registry: registers into workunits.hooks once the apps are loaded",
    ("ui/apps.py", "ready", "metrics"): "app registry: registers into metrics.hooks once the apps are loaded",
    ("ui/apps.py", "ready", "studies"): "app registry: registers into studies.hooks once the apps are loaded",
    ("xmc/apps.py", "ready", "xmc"): "app registry: the system checks register on import",
    ("xmc/apps.py", "ready", "xmc.api"): "app registry: the RPC handlers register on import (once)",
    ("xmc/apps.py", "ready", "xmc.auth"): "app registry: the auth signals import models",
    ("xmc/apps.py", "ready", "xmc.auth.identity"): "app registry: the identity cache imports models",
    ("xmc/celery.py", "_refuse_an_insecure_secret", "xmc.checks"):
        "loaded with the settings, before the app registry (xmc/__init__.py)",
    ("xmc/celery.py", "_worker_metrics", "xmc.ops"): "loaded with the settings, before the app registry",
    ("simulators/cluster/server.py", "_make_clock", "simulators.cluster.clock"):
        "optional: the API server runs without the controllers' clock (ControllersUnavailable)",
    ("simulators/cluster/server.py", "_start_controllers", "simulators.cluster.controllers"):
        "optional: the API server runs without the controllers (ControllersUnavailable)",
}


def function_level_imports() -> set[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or path.name.endswith("_pb2.py"):
                continue
            rel = str(path.relative_to(ROOT))

            def walk(node: ast.AST, function: str | None) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        walk(child, child.name)
                    elif isinstance(child, (ast.Import, ast.ImportFrom)) and function is not None:
                        modules = ([a.name for a in child.names] if isinstance(child, ast.Import)
                                   else [child.module or ""])
                        for module in modules:
                            if module.split(".")[0] in PACKAGES:
                                found.add((rel, function, module))
                    else:
                        walk(child, function)

            walk(parse(path.read_text(), rel), None)
    return found


def test_it_imports_our_modules_inside_functions_only_where_documented() -> None:
    assert sorted(function_level_imports() - set(ALLOWED)) == []


def test_it_lists_no_allowance_that_is_no_longer_needed() -> None:
    assert sorted(set(ALLOWED) - function_level_imports()) == []
