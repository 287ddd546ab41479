"""Run on the CPU device's disaggregated workers (this folder leads their PYTHONPATH): every
NIXL agent is created without its progress thread.

NIXL's Python agent gives that thread a zero delay, so it polls its sockets without sleeping:
each idle prefill or decode worker keeps most of a core busy, and three of them on two cores
starve everything else. vLLM has no switch for it. Without the thread, NIXL progresses a
transfer when vLLM asks for its state or its notifications, which vLLM does every engine step.
Python imports one `sitecustomize`; this one then imports the next on the path, if any.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

#: The modules that define `nixl_agent_config`: `nixl` loads one of them, by CUDA version.
AGENT_MODULES = ("nixl_cu12._api", "nixl_cu13._api")
HERE = os.path.dirname(os.path.abspath(__file__))


class _WithoutProgressThread(importlib.abc.MetaPathFinder):
    """Finds the agent's module as the rest of the path would, and turns the thread off in
    every configuration it builds."""

    def find_spec(self, name, path, target=None):
        if name not in AGENT_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            configure = module.nixl_agent_config.__init__

            def without_thread(config, *args, **kwargs):
                configure(config, *args, **kwargs)
                config.enable_pthread = False

            module.nixl_agent_config.__init__ = without_thread

        spec.loader.exec_module = exec_module
        return spec


def _import_the_next_sitecustomize() -> None:
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


sys.meta_path.insert(0, _WithoutProgressThread())
_import_the_next_sitecustomize()
