"""Loaded by a vLLM worker whose PYTHONPATH holds this folder, with `HANDOFF_UNDYING` set (the
engine_core test that makes the system under test break its promise for real): the worker
never exits for its engine's death. Its engine monitor never checks, and where a request that
raised `EngineDeadError` would shut its runtime down and end the process (`os._exit`), both
are skipped: the worker stays up and listed with no engine, as Dynamo issues 2698 and 14657
report. Logged to
stderr."""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import os
import sys

PATCHED = ("dynamo.vllm.handlers", "dynamo.vllm.engine_monitor")


async def never_checks(self):
    while True:
        await asyncio.sleep(3600)


class StaysUp:
    """The `os` module as the handlers see it, but for `_exit`."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def _exit(status):
        print(f"handoff-test: undying: os._exit({status}) skipped", file=sys.stderr)


class KeepsRunning:
    """A handler's runtime, but for `shutdown`: the worker stays registered and listed."""

    def __init__(self, runtime):
        self._runtime = runtime

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    def shutdown(self):
        print("handoff-test: undying: runtime shutdown skipped", file=sys.stderr)


def keeping_running(init):
    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if getattr(self, "runtime", None) is not None:
            self.runtime = KeepsRunning(self.runtime)

    return patched


def patch(module) -> None:
    if module.__name__.endswith("engine_monitor"):
        module.VllmEngineMonitor._check_engine_health = never_checks
    else:
        module.os = StaysUp()  # every engine-death path of the handlers ends in os._exit
        handler = module.BaseWorkerHandler
        handler.__init__ = keeping_running(handler.__init__)
    print(f"handoff-test: undying: {module.__name__} patched", file=sys.stderr)


class _Undying(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("HANDOFF_UNDYING"):
    sys.meta_path.insert(0, _Undying())
