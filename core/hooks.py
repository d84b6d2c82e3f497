"""The one shape of an extension point: how a lower app calls out to apps above it without importing them.

Two kinds, both typed by the arguments the caller passes:

* :class:`Hooks`: every registered listener hears of something that happened
  (a transition committed, points written, an artifact attached). A listener
  registers once however often its app's ``ready()`` runs. By default a
  failing listener is logged under the hook's event name and never fails the
  caller; ``contained=False`` lets the failure reach the caller (a hook called
  inside the caller's transaction, which must roll back with it).
* :class:`Provider`: the one answerer of a question a lower app asks (the
  notify-when of a task, how a failed execution's containers ended). While
  none is registered, or when it fails (logged), the caller gets the default.
* :class:`Handlers`: the one handler, per kind of row, of a command a lower app
  carries out on rows of the apps above (the admin's "send again" of a dead
  letter about a notification delivery). A failure reaches the caller: a
  command must say why it did not happen.

The registries themselves belong to the app that calls them
(``workunits.hooks``, ``metrics.hooks``, ``artifacts.hooks``); the apps above
register into them in their ``AppConfig.ready()``.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Generic, ParamSpec, TypeVar

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


class Hooks(Generic[P]):
    """Listeners ``(*args)`` of one event, called in the order they registered."""

    def __init__(self, failed_event: str, *, contained: bool = True) -> None:
        self.failed_event = failed_event
        self.contained = contained
        self._hooks: list[Callable[P, object]] = []

    def register(self, hook: Callable[P, object]) -> None:
        """Add ``hook`` (once: registering it again changes nothing)."""
        if hook not in self._hooks:
            self._hooks.append(hook)

    def unregister(self, hook: Callable[P, object]) -> None:
        if hook in self._hooks:
            self._hooks.remove(hook)

    def __contains__(self, hook: object) -> bool:
        return hook in self._hooks

    def __iter__(self) -> Iterator[Callable[P, object]]:
        return iter(list(self._hooks))

    def __len__(self) -> int:
        return len(self._hooks)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for hook in list(self._hooks):
            if not self.contained:
                hook(*args, **kwargs)
                continue
            try:
                hook(*args, **kwargs)
            except Exception:  # a listener must never fail the caller
                log.exception(self.failed_event, extra={"hook": getattr(hook, "__qualname__", repr(hook))})


class Provider(Generic[P, R]):
    """The one registered answerer of a question; ``default()`` while there is none or when it fails."""

    def __init__(self, failed_event: str, default: Callable[[], R]) -> None:
        self.failed_event = failed_event
        self.default = default
        self._provider: Callable[P, R] | None = None

    def set(self, provider: Callable[P, R] | None) -> None:
        """Register the provider (``None``: none; every call answers the default)."""
        self._provider = provider

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._provider is None:
            return self.default()
        try:
            return self._provider(*args, **kwargs)
        except Exception:  # a caller without the answer is better off than a failed caller
            log.exception(self.failed_event)
            return self.default()


class Handlers(Generic[P]):
    """One handler ``(*args)`` per key (a kind of row, ``app_label.model``); calling an unknown key raises
    :class:`LookupError`, and a handler's own failure reaches the caller."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._by_key: dict[str, Callable[P, object]] = {}

    def register(self, key: str, handler: Callable[P, object]) -> None:
        """The handler of ``key`` (registering again replaces it: one owner per kind of row)."""
        self._by_key[key] = handler

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __call__(self, key: str, *args: P.args, **kwargs: P.kwargs) -> object:
        handler = self._by_key.get(key)
        if handler is None:
            raise LookupError(f"no {self.what} for {key!r}")
        return handler(*args, **kwargs)
