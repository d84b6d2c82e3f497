"""The one shape of an extension point: listeners registered once, failures contained, one provider."""
from __future__ import annotations

import logging

import pytest

from core.hooks import Hooks, Provider


def test_it_tells_a_listener_registered_twice_each_event_once() -> None:
    heard: list[int] = []
    hooks: Hooks[[int]] = Hooks("test.failed")
    listener = heard.append
    hooks.register(listener)
    hooks.register(listener)  # an app's ready() may run again
    hooks(7)
    assert heard == [7] and len(hooks) == 1 and listener in hooks


def test_it_logs_a_failing_listener_and_the_others_still_hear(caplog: pytest.LogCaptureFixture) -> None:
    heard: list[str] = []

    def broken(what: str) -> None:
        raise RuntimeError("boom")

    hooks: Hooks[[str]] = Hooks("test.listener_failed")
    hooks.register(broken)
    hooks.register(heard.append)
    with caplog.at_level(logging.ERROR):
        hooks("committed")  # the caller does not fail
    assert heard == ["committed"]
    assert [r.message for r in caplog.records] == ["test.listener_failed"]


def test_it_fails_the_caller_from_a_hook_inside_the_callers_transaction() -> None:
    def broken(xid: int) -> None:
        raise RuntimeError("roll back")

    hooks: Hooks[[int]] = Hooks("test.failed", contained=False)
    hooks.register(broken)
    with pytest.raises(RuntimeError, match="roll back"):
        hooks(1)


def test_it_answers_a_providers_default_until_one_is_registered_and_when_it_fails(
        caplog: pytest.LogCaptureFixture) -> None:
    provider: Provider[[int, int], str] = Provider("test.provider_failed", str)
    assert provider(1, 2) == ""
    provider.set(lambda xid, wid: f"{xid}.{wid}")
    assert provider(1, 2) == "1.2"
    provider.set(lambda xid, wid: str(1 // 0))
    with caplog.at_level(logging.ERROR):
        assert provider(1, 2) == ""
    assert [r.message for r in caplog.records] == ["test.provider_failed"]
    provider.set(None)
    assert provider(3, 4) == ""
