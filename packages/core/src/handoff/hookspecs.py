"""What a handoff plugin may answer. Each hook's docstring is its contract."""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from handoff.backend import Backend

hookspec = pluggy.HookspecMarker("handoff")
hookimpl = pluggy.HookimplMarker("handoff")


@hookspec
def register_backends(register: Callable[[Backend], None]) -> None:
    """Called once when plugins load; call `register(backend)` for each Backend you provide.

    A backend name must be unique across installed plugins: a second one is an error.
    """
