"""Loaded by a vLLM worker whose PYTHONPATH holds this folder (tests that break a migration on
purpose): the worker's engine is given a wrong context, as a broken migration or KV transfer
would deliver it, or the worker's output is changed on its way to the frontend.
`HANDOFF_PERTURB` names the perturbation (perturbations.py: of the context, the output or the
request's sampling), `HANDOFF_PERTURB_PROMPT` the
prompt's length in tokens; a request is perturbed when it holds more than
`HANDOFF_PERTURB_ABOVE` tokens (the prompt's length: only a re-issued request, whose context
holds what was generated before the move; 0: every request, for a prefill worker whose KV the
decode worker then reads). Each perturbed request is logged to the worker's stderr."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

from perturbations import OUTPUT_PERTURBATIONS, REQUEST_PERTURBATIONS, perturbations

HANDLERS = "dynamo.vllm.handlers"


def perturbing(generate):
    name, prompt = os.environ["HANDOFF_PERTURB"], int(os.environ["HANDOFF_PERTURB_PROMPT"])
    above, chat = int(os.environ["HANDOFF_PERTURB_ABOVE"]), os.environ["HANDOFF_PERTURB_CHAT"]

    async def perturbed(self, request, context):
        tokens = request.get("token_ids") or []
        wrong = len(tokens) > above
        if wrong and name in REQUEST_PERTURBATIONS:
            print(f"handoff-test: {name}: after {len(tokens)} tokens", file=sys.stderr)
            request = REQUEST_PERTURBATIONS[name](request)
        chunks = generate(self, request, context)
        if wrong and name in OUTPUT_PERTURBATIONS:
            print(f"handoff-test: {name}: after {len(tokens)} tokens", file=sys.stderr)
            chunks = wrong_output(chunks, OUTPUT_PERTURBATIONS[name])
        elif wrong and name not in REQUEST_PERTURBATIONS:
            wrong_context = perturbations(prompt, len(tokens) - prompt, chat == "1")[name]
            request["token_ids"] = wrong_context(list(tokens))
            print(
                f"handoff-test: {name}: {len(tokens)} tokens -> {len(request['token_ids'])}",
                file=sys.stderr,
            )
        async for chunk in chunks:
            yield chunk

    return perturbed


async def wrong_output(chunks, perturb):
    index = 0
    async for chunk in chunks:
        yield perturb(chunk, index)
        index += 1


class _Perturbing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != HANDLERS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            for handler in (module.DecodeWorkerHandler, module.PrefillWorkerHandler):
                handler.generate = perturbing(handler.generate)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("HANDOFF_PERTURB"):
    sys.meta_path.insert(0, _Perturbing())
