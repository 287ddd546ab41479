"""Every path that judges a response's text judges its tokens' log-probabilities too, by the vLLM
backend's own judge (handoff_vllm.fingerprint): a stop request's and a min_tokens request's (the
string the frontend held back included, in the frames Dynamo sends: test_logprobs.py replays
them), the probe a healed or joined worker serves, and what a client that left had read. On each,
log-probabilities computed after the true context pass; after a wrong context that keeps the
rule's parity (two prompt tokens swapped), whose text the rule alone cannot tell, they fail by the
first token that departs; a token without them, or a response without any, fails."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from perturbing_worker.perturbations import perturbations
from test_vllm_cpu import on_cpu

from handoff.cases import Case
from handoff.client import Chunk, Request, Response
from handoff.responses import abandon, evidence, recovery, stops
from handoff.responses.waits import REFERENCE
from handoff_vllm import fingerprint, rule
from handoff_vllm.fingerprint import TOLERANCE, TOP_LOGPROBS

BACKEND = on_cpu()
API = "completion"
SHAPE = replace(
    BACKEND.shape(Case.from_id("worker_failure-completion-stream-tcp", "stop")), max_tokens=24
)
CONTEXT, OUTPUT = BACKEND.reference_tokens(API, SHAPE)
#: Tokens the client read before it left.
READ = 10
SWAPPED = "two prompt tokens swapped"


def tops(context: list[int], tokens: list[int]) -> list[dict[str, float]]:
    """The engine's answer for `tokens` generated after `context`: each one's top
    log-probabilities, by word."""
    rows = fingerprint.logprobs(context + tokens[:-1], len(context) - 1)
    best = np.argsort(-rows, axis=-1)[:, :TOP_LOGPROBS]
    return [{f"t{t}": float(row[t]) for t in ids} for row, ids in zip(rows, best, strict=True)]


def frame(text: str, top: list[dict[str, float]], finish: str | None = None) -> Chunk:
    logprobs = {"tokens": [max(t, key=t.get) for t in top], "top_logprobs": top}
    choice = {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}
    return Chunk(0.0, {"id": "cmpl-1", "choices": [choice]})


def words(tokens: list[int]) -> str:
    return "".join(f" {w}" for w in rule.words(tokens))


def answered(chunks: list[Chunk], tokens: int | None, stream: bool = True) -> Response:
    """A response of `chunks`, complete with its usage (`tokens`), or left by its client (None)."""
    if tokens is None:
        return Response(status=200, chunks=chunks, streamed=stream, closed_by_client=True)
    chunks = [*chunks, Chunk(0.0, {"id": "cmpl-1", "choices": [], "usage": {
        "completion_tokens": tokens}})]  # fmt: skip
    return Response(status=200, chunks=chunks, done=stream, streamed=stream)


def stopped(kind: str):
    """A stop request of `kind` and its response as Dynamo frames it: a frame a token up to the
    string, then the space before it, then a frame of no text for each token held back."""
    stop = stops.planned(BACKEND, API, SHAPE, 3, kind)
    request = Request(API, True, "m", SHAPE.prompt, SHAPE.max_tokens, top_logprobs=5, stop=stop)
    text = stops.owed_before((BACKEND.reference(API, SHAPE), REFERENCE), stop)
    owed = evidence.owing(BACKEND, request, SHAPE, text)

    def respond(top: list[dict[str, float]]) -> Response:
        shown = [frame(words([t]), [e]) for t, e in zip(OUTPUT[: stop.begins], top, strict=False)]
        held = [frame("" if n else " ", [e]) for n, e in enumerate(top[stop.begins : stop.ends])]
        held[-1].choice["finish_reason"] = "stop"
        return answered(shown + held, stop.ends)

    def check(response: Response) -> list[str]:
        return evidence.checked_content(
            request, response, owed, True, BACKEND, lambda: None
        ).problems

    return OUTPUT[: stop.ends], respond, check


def probed():
    """The probe a healed worker took: unary, `recovery.REJOIN_TOKENS` long."""
    probe = recovery.short(Request(API, True, "m", SHAPE.prompt, 24, top_logprobs=5))
    owed = recovery.probe_reference(SimpleNamespace(backend=BACKEND), probe, SHAPE, None)
    tokens = OUTPUT[: recovery.REJOIN_TOKENS]

    def respond(top: list[dict[str, float]]) -> Response:
        return answered([frame(words(tokens), top, "length")], len(tokens), stream=False)

    def check(response: Response) -> list[str]:
        deployment = SimpleNamespace(backend=BACKEND, serving=[])
        holder = SimpleNamespace(name="worker-1", role="aggregate")
        return recovery.served_problems(deployment, holder, probe, response, 0, owed)

    return tokens, respond, check


def left():
    """A client that left after `READ` tokens (`abandon.Leaving`)."""
    case = Case.from_id("client_close-completion-tcp", "abandoned")
    request = Request(API, True, "m", SHAPE.prompt, 24, top_logprobs=BACKEND.top_logprobs(case))
    tokens = OUTPUT[:READ]

    def respond(top: list[dict[str, float]]) -> Response:
        return answered([frame(words([t]), [e]) for t, e in zip(tokens, top, strict=False)], None)

    def check(response: Response) -> list[str]:
        return abandon.delivered_problems(BACKEND, case, SHAPE, request, response)

    return tokens, respond, check


PATHS = {
    "stop": lambda: stopped("stop"),
    "min_tokens": lambda: stopped("min_tokens"),
    "probe": probed,
    "abandoned": left,
}
HEALED = "worker-1, healed after its fault, took a request and failed it: "


def only(problems: list[str]) -> str:
    """The one problem, less the probe's preamble."""
    (problem,) = problems
    return problem.removeprefix(HEALED)


@pytest.mark.parametrize("path", PATHS)
def test_log_probabilities_computed_after_the_true_context_pass(path):
    tokens, respond, check = PATHS[path]()
    assert check(respond(tops(CONTEXT, tokens))) == []


@pytest.mark.parametrize("path", PATHS)
def test_a_wrong_context_the_text_cannot_show_fails_by_the_first_departing_token(path):
    tokens, respond, check = PATHS[path]()
    wrong = perturbations(len(CONTEXT), 0, chat=False)[SWAPPED](CONTEXT)
    assert rule.continuation(wrong, len(tokens)) == tokens  # the rule's parity kept
    problem = only(check(respond(tops(wrong, tokens))))
    assert problem.startswith("the log-probabilities depart from the reference at token 1: ")


@pytest.mark.parametrize("path", ["stop", "min_tokens"])
def test_a_held_back_tokens_log_probabilities_are_judged_too(path):
    tokens, respond, check = PATHS[path]()
    top = tops(CONTEXT, tokens)
    last = top[-1]
    last[max(last, key=last.get)] -= 2 * TOLERANCE
    problem = only(check(respond(top)))
    assert problem.startswith(
        f"the log-probabilities depart from the reference at token {len(tokens)}: "
    )


def one_entry_lost(response) -> None:
    carrying = [c for c in response.chunks if c.top_logprobs]
    carrying[-1].choice["logprobs"]["top_logprobs"].pop()


def every_entry_lost(response) -> None:
    for chunk in response.chunks:
        chunk.choice.pop("logprobs", None)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("lose", "expected"),
    [
        (one_entry_lost, "{carried} tokens carry log-probabilities; the client received "),
        (every_entry_lost, "the response carries no log-probabilities; the request asked for 5"),
    ],
)
def test_log_probabilities_missing_fail_by_name(path, lose, expected):
    """A reading that is missing is no agreement: one token's, or all of them."""
    tokens, respond, check = PATHS[path]()
    response = respond(tops(CONTEXT, tokens))
    lose(response)
    assert only(check(response)).startswith(expected.format(carried=len(tokens) - 1))
