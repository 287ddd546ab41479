"""A pytest plugin for a qualification run (`-p unproven_run`, with this folder on
PYTHONPATH) whose cases are made not proven for real: each request goes through the altering
proxy in its `burst` mode (the faulted worker's last frame reaches the client after the new
worker received the request, back to back with the new worker's first, as a client that fell
behind reads them), the mocker's workers replay no output of their own (their tokens, drawn at
random, do not name their worker: handoff_mocker.origins) and keep no record of the context
they received (none by default), so where the new worker's tokens begin is really ambiguous."""

from __future__ import annotations

import pytest
from altering_proxy import AlteringProxy, through_proxy

from handoff_mocker import MockerBackend

PATCH = pytest.MonkeyPatch()
#: The proxies `through_proxy` starts, one per case, as it starts them: closed at the end.
STARTED: list[list[AlteringProxy]] = []


def pytest_configure(config: pytest.Config) -> None:
    STARTED.append(through_proxy(PATCH, "burst"))
    PATCH.setattr(MockerBackend, "replays", lambda self, case: False)


def pytest_unconfigure(config: pytest.Config) -> None:
    for proxy in (p for started in STARTED for p in started):
        proxy.close()
    PATCH.undo()
