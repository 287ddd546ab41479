"""What a migration can get wrong in the context it re-issues, made on purpose for the built-in
vLLM model's rule (tests/unit/test_vllm_rule.py) and weights (tests/vllm_cpu/test_model.py)."""

from __future__ import annotations

from handoff.cases import selection
from handoff_vllm import rule

WITHIN = 8


def pre_merge_requests(backend) -> list[tuple[str, list[int], list[int]]]:
    """(name, context, reference output) of every distinct pre-merge request shape."""
    requests = {}
    for topology in backend.topologies:
        for case in selection(topology, "pre_merge", backend):
            shape = backend.shape(case)
            context = rule.context_of(shape.prompt, case.api)
            key = f"{topology}/{case.api}"
            requests[key] = (key, context, rule.continuation(context, shape.max_tokens))
    return list(requests.values())


def perturbed(context: list[int], output: list[int], cut: int, at: int, api: str):
    """Each way a migration can get its context wrong, after `cut` tokens of `output`, with
    `at` picking the generated token to lose or repeat."""
    done = output[:cut]
    prompt = context[1:-1] if api == "chat" else context
    yield "the prompt dropped", done
    yield f"generated token {at} dropped", context + done[:at] + done[at + 1 :]
    yield f"generated token {at} repeated", context + done[: at + 1] + done[at:]
    # Rotary positions count only from one token to another: shifting the whole context is
    # no change to any Llama. What a migration can shift is the output against its prompt.
    yield "the output shifted one position from its prompt", [*context, rule.ASSISTANT, *done]
    if api == "chat":
        twice = [rule.USER, rule.USER, *prompt, rule.ASSISTANT, rule.ASSISTANT]
        yield "the chat template rendered twice", twice + done
