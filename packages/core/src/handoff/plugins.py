"""Plugins: what a handoff plugin may answer (each hook's docstring is its contract), and the
plugin manager, which finds backends in the `handoff.backends` entry point group only."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

import pluggy

from handoff.backend import Backend
from handoff.errors import HandoffError
from handoff.settings import resolve

hookspec = pluggy.HookspecMarker("handoff")
hookimpl = pluggy.HookimplMarker("handoff")
GROUP = "handoff.backends"
#: Comma-separated entry point names; when set, only those plugins load.
ONLY_ENV = "HANDOFF_PLUGINS"


@hookspec
def register_backends(register: Callable[[Backend], None]) -> None:
    """Called once when plugins load; call `register(backend)` for each Backend you provide.

    A backend name must be unique across installed plugins: a second one is an error.
    """


@dataclass(frozen=True)
class Loaded:
    """The backends that loaded, and one line for each plugin that did not."""

    backends: dict[str, Backend]
    broken: dict[str, str]
    #: Installed plugins that HANDOFF_PLUGINS left out, by entry point name.
    filtered: tuple[str, ...] = ()

    def unknown(self, name: str) -> str:
        """Why no backend is called `name`, and the fix: a filter that left it out, the nearest
        installed name, or what is installed."""
        only = os.environ.get(ONLY_ENV, "")
        if name in self.filtered:
            return (
                f"backend {name!r} is installed but {ONLY_ENV}={only!r} leaves it out: add it "
                f"there or unset {ONLY_ENV}"
            )
        listing = ", ".join(sorted(self.backends)) or "none"
        near = difflib.get_close_matches(name, [*self.backends, *self.filtered], n=1)
        hint = f"did you mean {near[0]!r}?" if near else "install the package that provides it"
        note = f"; {ONLY_ENV}={only!r} left out {', '.join(self.filtered)}" if self.filtered else ""
        return f"unknown backend {name!r} (loaded: {listing}{note}): {hint}"


@cache
def load() -> Loaded:
    """Load every installed plugin once. A broken plugin (fails to import, hook raises,
    registers something that is not a Backend) is recorded with its package and skipped, so
    the other backends still work."""
    pm = pluggy.PluginManager("handoff")
    pm.add_hookspecs(sys.modules[__name__])
    only = {n.strip() for n in os.environ.get(ONLY_ENV, "").split(",") if n.strip()}
    packages: dict[str, str] = {}
    broken: dict[str, str] = {}
    filtered = []
    for ep in entry_points(group=GROUP):
        if only and ep.name not in only:
            filtered.append(ep.name)
            continue
        packages[ep.name] = ep.dist.name if ep.dist else "its package"
        try:
            module = ep.load()
            pm.register(module, name=ep.name)
        except Exception as exc:  # any failure of third-party code is that plugin's fault
            broken[ep.name] = _broken(ep.name, packages[ep.name], "failed to load", exc)
            continue
        if not pm.get_hookcallers(module):
            missing = LookupError("no @hookimpl register_backends(register) in " + ep.value)
            broken[ep.name] = _broken(ep.name, packages[ep.name], "has no hook", missing)
    found: dict[str, Backend] = {}
    for impl in pm.hook.register_backends.get_hookimpls():
        mine: list[object] = []
        try:
            impl.function(register=mine.append)
            for backend in mine:
                if not isinstance(backend, Backend):
                    raise TypeError(f"registered {type(backend).__name__}, not a handoff Backend")
                if backend.name in found:
                    raise ValueError(f"a backend named {backend.name!r} is already registered")
        except Exception as exc:
            package = packages.get(impl.plugin_name, "its package")
            broken[impl.plugin_name] = _broken(impl.plugin_name, package, "is broken", exc)
            continue
        found.update((backend.name, backend) for backend in mine)
    return Loaded(found, broken, tuple(sorted(filtered)))


def _broken(plugin: str, package: str, what: str, exc: Exception) -> str:
    return (
        f"backend plugin {plugin!r} (package {package}) {what}: "
        f"{type(exc).__name__}: {exc}; fix or uninstall {package}"
    )


def get_backend(name: str) -> Backend:
    """The backend called `name`; if its plugin is broken, that error; else why it is unknown."""
    loaded = load()
    if name in loaded.backends:
        return loaded.backends[name]
    if name in loaded.broken:
        raise HandoffError(loaded.broken[name])
    raise HandoffError(loaded.unknown(name))


def installed_backends() -> set[str]:
    """The backends installed plugins provide, whether they loaded or not: those that loaded,
    and the plugins that broke or that HANDOFF_PLUGINS leaves out (by entry point name)."""
    loaded = load()
    return {*loaded.backends, *loaded.broken, *loaded.filtered}


def configured_backend(
    name: str, overrides: dict[str, tuple[object, str]] | None = None, start: Path | None = None
):
    """The backend called `name`, configured with the team's settings found from `start`
    (default: the working folder) and the command line's `overrides`."""
    backend = get_backend(name)
    backend.configure(
        resolve(
            name, backend.defaults, installed_backends(), overrides, start, backend.uses_settings
        )
    )
    return backend
