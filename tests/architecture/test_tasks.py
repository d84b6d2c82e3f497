"""Every Celery task is declared one way: ``delivery.declare.task`` (docs/STYLE.md, "A new queue or task").

That decorator gives each task its name and queue, a time limit, late
acknowledgement, its retries, and the one log line and metrics per run. A
``shared_task`` or ``app.task`` elsewhere in production code would be a task
without them; a registered task without a time limit could hold a worker for
ever. Celery's own tasks (``celery.*``) are not ours.
"""
from __future__ import annotations

import ast

from celery import current_app

from delivery import declare
from tests.architecture.production import PACKAGES, ROOT, modules

#: The one declaration.
ALLOWED = {"delivery/declare.py"}


def direct_declarations() -> list[str]:
    """``shared_task`` (imported or called) and ``<app>.task(...)`` in production modules."""
    found = []
    for rel, tree in modules(ALLOWED):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(a.name == "shared_task" for a in node.names):
                found.append(f"{rel}:{node.lineno} imports shared_task")
            elif isinstance(node, ast.Attribute) and node.attr == "shared_task":
                found.append(f"{rel}:{node.lineno} celery.shared_task")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "task"
                  and isinstance(node.func.value, ast.Name) and node.func.value.id != "declare"):
                found.append(f"{rel}:{node.lineno} {node.func.value.id}.task(...)")
    return found


def our_tasks() -> dict[str, object]:
    current_app.loader.import_default_modules()  # what a worker imports: every app's tasks module
    return {name: task for name, task in current_app.tasks.items()
            if str(getattr(task, "__module__", "")).split(".")[0] in PACKAGES}


def test_it_lets_no_production_module_declare_a_task_but_through_delivery_declare() -> None:
    assert direct_declarations() == []


def test_it_has_the_check_find_a_direct_declaration() -> None:
    # The scan looks for the right thing: the one allowed module is found by it.
    tree = ast.parse((ROOT / "delivery" / "declare.py").read_text())
    assert any(isinstance(n, ast.ImportFrom) and any(a.name == "shared_task" for a in n.names) for n in ast.walk(tree))


def test_it_finds_every_registered_task_declared_with_a_time_limit_and_logging_its_runs() -> None:
    tasks = our_tasks()
    assert "xmc.ping" in tasks and "xmc.delivery.sweep" in tasks and "xmc.notifications.deliver" in tasks
    undeclared = sorted(name for name, task in tasks.items() if not isinstance(task, declare.Task))
    assert undeclared == []
    unlimited = sorted(name for name, task in tasks.items()
                       if not getattr(task, "soft_time_limit", None) or not getattr(task, "time_limit", None))
    assert unlimited == []
    assert all(getattr(task, "soft_time_limit") < getattr(task, "time_limit") for task in tasks.values())
