"""Loaded by a vLLM worker whose PYTHONPATH holds this folder, with `HANDOFF_IGNORE_ABORTS` set:
its engine ignores every abort. vLLM's `EngineCore.abort_requests` (vllm/v1/engine/core.py), the
one place where the engine core's scheduler finishes the requests its client aborts, does
nothing, so the engine decodes an aborted request to its end and its own
`vllm:num_requests_running` counts it all the while. Everything above it is untouched: Dynamo's
handler and vLLM's `AsyncLLM.abort` let the request go as they always do (the output processor
drops it and ignores its further outputs), so only the engine goes on. The engine core runs in
the worker's `VLLM::EngineCore` child: forked, it inherits the patched class; spawned, it loads
this file again from the inherited PYTHONPATH. Each ignored abort is logged to stderr (the
worker's log) with the process it happened in: twice for one abort, as the engine core's input
thread hands each abort both to its eager aborts queue and to its ordered input queue."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

CORE = "vllm.v1.engine.core"


def ignore_abort(self, request_ids):
    print(
        f"handoff-test: ignore_aborts: abort of {list(request_ids)} ignored (pid {os.getpid()})",
        file=sys.stderr,
        flush=True,
    )


class _IgnoringAborts(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != CORE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            module.EngineCore.abort_requests = ignore_abort
            print(f"handoff-test: ignore_aborts: {CORE} patched", file=sys.stderr, flush=True)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("HANDOFF_IGNORE_ABORTS"):
    sys.meta_path.insert(0, _IgnoringAborts())
