"""Only the delivery floor hands messages to the broker (docs/architecture/delivery.md).

Everything that crosses the broker is a committed row first, published by
``delivery.broker.publish`` and re-sent by the one sweep; a ``send_task``,
``apply_async`` or ``delay`` anywhere else in production code would be a
message no row stands for (lost with Redis, never re-sent). This test fails
until such a call goes through ``delivery.broker`` (or, for a new queue,
``workunits.delivery.enqueue``; docs/STYLE.md says where).
"""
from __future__ import annotations

import ast

from tests.architecture.production import ROOT, modules

PUBLISHING = {"send_task", "apply_async", "delay"}
#: The one publisher.
ALLOWED = {"delivery/broker.py"}


def publishing_calls() -> list[str]:
    found = []
    for rel, tree in modules(ALLOWED):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PUBLISHING:
                found.append(f"{rel}:{node.lineno} {node.func.attr}")
    return found


def test_it_lets_no_production_module_but_the_delivery_floor_publish_to_the_broker() -> None:
    assert publishing_calls() == []


def test_it_finds_the_delivery_floor_itself_publishing_through_send_task() -> None:
    # The check above looks for the right thing: the one allowed module is found by it.
    tree = ast.parse((ROOT / "delivery" / "broker.py").read_text())
    assert any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "send_task"
               for n in ast.walk(tree))
