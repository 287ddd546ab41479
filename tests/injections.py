"""Tests that change how a fault is made do it where handoff makes it: in the lifecycle's own
injection (`handoff.lifecycle.Lifecycle.inject`), replaced for the test in the registry every
case reads its lifecycle from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from handoff import lifecycle

#: An injection: (run, holder, watched, aimed) -> faults.FaultReport.
Injection = Callable[..., object]


def wrap_injections(patch: pytest.MonkeyPatch, wrap: Callable[[Injection], Injection]) -> None:
    """Every registered lifecycle's injection replaced by `wrap(injection)` for the test."""
    registry = lifecycle.registered()
    for name, found in list(registry.items()):
        if found.inject is not None:
            patch.setitem(registry, name, replace(found, inject=wrap(found.inject)))


def replace_lifecycle(patch: pytest.MonkeyPatch, name: str, **changes: object) -> None:
    """The lifecycle `name` with `changes` for the test."""
    registry = lifecycle.registered()
    patch.setitem(registry, name, replace(registry[name], **changes))
