"""The plugin manager: backends come from the `handoff.backends` entry point group only."""

from __future__ import annotations

import os
from functools import cache
from importlib.metadata import entry_points

import pluggy

from handoff import hookspecs
from handoff.backend import Backend
from handoff.errors import HandoffError

GROUP = "handoff.backends"
#: Comma-separated entry point names; when set, only those plugins load.
ONLY_ENV = "HANDOFF_PLUGINS"


@cache
def plugin_manager() -> pluggy.PluginManager:
    """Load every installed plugin once; a plugin that fails to import is a clear error."""
    pm = pluggy.PluginManager("handoff")
    pm.add_hookspecs(hookspecs)
    only = {n.strip() for n in os.environ.get(ONLY_ENV, "").split(",") if n.strip()}
    for ep in entry_points(group=GROUP):
        if only and ep.name not in only:
            continue
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not take the harness down silently
            dist = ep.dist.name if ep.dist else "its package"
            raise HandoffError(
                f"backend plugin {ep.name!r} ({ep.value}) failed to load: "
                f"{type(exc).__name__}: {exc}; fix or uninstall {dist}"
            ) from exc
        pm.register(module, name=ep.name)
    return pm


@cache
def backends() -> dict[str, Backend]:
    """Every registered backend by name."""
    found: dict[str, Backend] = {}

    def register(backend: Backend) -> None:
        if backend.name in found:
            raise HandoffError(
                f"two plugins register a backend named {backend.name!r}: uninstall one"
            )
        found[backend.name] = backend

    plugin_manager().hook.register_backends(register=register)
    return found


def get_backend(name: str) -> Backend:
    """The backend called `name`, or an error listing the installed ones."""
    installed = backends()
    if name not in installed:
        listing = ", ".join(sorted(installed)) or "none"
        raise HandoffError(
            f"unknown backend {name!r} (installed: {listing}); "
            f"install its package, e.g. pip install handoff-{name}"
        )
    return installed[name]
