"""What a move does to a request's features, measured on Dynamo's frontend and two vLLM CPU
workers running handoff's tiny model: for each feature, the same request undisturbed and with
its worker SIGKILLed after `--after` streamed tokens, and whether the user got the same text,
finish reason and usage. Prints one row a feature (issue 44: the first step, what Dynamo 1.6.1
does, before cases judge it).

    PATH=.nox/vllm_cpu_pre_merge/bin:$PATH python benchmarks/request_features.py [--after 12]

The stop strings are chosen from the model's own continuation (handoff_vllm.rule): one whose
match spans the kill's neighbourhood, one well after it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handoff import metrics
from handoff.cases import Case
from handoff.client import InFlight, Request
from handoff.deployment import Deployment
from handoff.machine.polling import Deadline, poll_until
from handoff.plugins import configured_backend
from handoff.policies import policy
from handoff_vllm import rule

CASE = Case.from_id("migration_enabled-worker_failure-completion-stream-tcp")
MAX_TOKENS = 120
READ_S = 120.0


@dataclass(frozen=True)
class FeatureRequest(Request):
    """A completion stream with the feature's fields over the plain request's."""

    extra: tuple[tuple[str, Any], ...] = ()

    def body(self) -> dict[str, Any]:
        return {**super().body(), **dict(self.extra)}


def features(prompt: str, after: int) -> dict[str, dict[str, Any]]:
    """The fields each probe sends: stop strings are words of the reference continuation."""
    words = rule.words(rule.continuation(rule.context_of(prompt, "completion"), MAX_TOKENS))
    eos = {"ignore_eos": False}  # Dynamo drops a request's stop strings with ignore_eos
    return {
        "plain": {},
        # From the kill to well after it: the frontend holds back what may be a stop string's
        # start, so the client sees the `after` tokens before it, and the kill lands inside the
        # match (the moved usage's prompt_tokens, the prompt and the tokens carried, say where).
        "stop spanning the move": {**eos, "stop": [" ".join(words[after : after + 28])]},
        "stop after the move": {**eos, "stop": [" ".join(words[after + 40 : after + 42])]},
        "min_tokens past a stop": {
            **eos,
            "stop": [" ".join(words[5:7]), " ".join(words[after + 30 : after + 32])],
            "min_tokens": after + 20,
        },
        "stop, ignore_eos": {"stop": [" ".join(words[after + 40 : after + 42])]},
        "frequency_penalty 2": {"frequency_penalty": 2.0},
        "repetition_penalty 5": {"repetition_penalty": 5.0},
        "seed 7 at temperature 10": {"temperature": 10.0, "seed": 7},
        "logprobs 3": {"logprobs": 3},
    }


def send(deployment: Deployment, prompt: str, extra: dict[str, Any]) -> InFlight:
    assert deployment.model is not None
    request = FeatureRequest(
        "completion", True, deployment.model.name, prompt, MAX_TOKENS, None,
        extra=tuple(extra.items()),
    )  # fmt: skip
    return InFlight(deployment.base_url, request, READ_S)


def ended(flight: InFlight) -> InFlight:
    poll_until(lambda: (True if flight.finished else None, "open"), Deadline(READ_S), "the end")
    return flight


def moved(deployment: Deployment, prompt: str, extra: dict[str, Any], after: int) -> InFlight:
    """The request, its worker SIGKILLed once `after` tokens have streamed."""
    flight = send(deployment, prompt, extra)
    poll_until(
        lambda: (True if len(flight.response.chunks) >= after or flight.finished else None, ""),
        Deadline(60),
        f"{after} streamed chunks",
    )
    if flight.finished:  # refused, or over before the kill: nothing to move
        return flight
    (holder,) = deployment.backend.holders(deployment.workers)  # one, or this is no probe
    holder.process.kill()
    if left := holder.process.wait_gone(Deadline(30)):
        raise SystemExit(f"{holder.name} outlived SIGKILL: {left}")
    return ended(flight)


def moves(deployment: Deployment) -> int:
    """The moves the frontend has counted so far."""
    assert deployment.model is not None
    url = deployment.base_url + "/metrics"
    counts = metrics.MigrationCounts.read(url, deployment.model.name)
    return counts.ongoing_request + counts.new_request


def described(flight: InFlight) -> tuple[str, str, str]:
    response = flight.response
    text = "".join(c.text or "" for c in response.chunks)
    usage = response.usage or {}
    finish = response.finish_reason or (response.error and str(response.error)) or "none"
    return text, str(finish), f"{usage.get('prompt_tokens')}+{usage.get('completion_tokens')}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--after", type=int, default=12)
    parser.add_argument("--only", nargs="*", help="the features to probe (all by default)")
    args = parser.parse_args()
    backend = configured_backend("vllm", {"device": ("cpu", "request_features.py")})
    prompt = backend.shape(CASE).prompt
    print(f"{'feature':<26} {'same text':>9} {'finish (moved vs not)':<24} usage (moved vs not)")
    for name, extra in features(prompt, args.after).items():
        if args.only and name not in args.only:
            continue
        print(probe(backend, prompt, name, extra, args.after), flush=True)
    return 0


def probe(backend, prompt: str, name: str, extra: dict[str, Any], after: int) -> str:
    """One feature on a deployment of its own (a killed worker's discovery entries linger)."""
    folder = Path(tempfile.mkdtemp(prefix="handoff-features-"))
    deployment = Deployment(backend, CASE, folder, policy(CASE.policy), ("aggregate",) * 2)
    try:
        deployment.start(Deadline(600))
        alone = described(ended(send(deployment, prompt, extra)))
        again = described(ended(send(deployment, prompt, extra)))
        move = described(moved(deployment, prompt, extra, after))
        counted = moves(deployment)
    finally:
        if problems := deployment.stop():
            print(f"teardown: {problems}")
    same = "yes" if move[0] == alone[0] else f"no ({folder})"
    if counted != 1:  # ended before the kill, refused, or moved twice: not this row's question
        same = f"not moved once ({counted} moves)"
    repeat = "" if again == alone else " (undisturbed differs from itself)"
    stops = [s for s in extra.get("stop", []) if s in alone[0]]
    seen = f"; stop strings in the undisturbed text: {stops}" if "stop" in extra else ""
    return (
        f"{name:<26} {same:>9} {move[1] + ' vs ' + alone[1]:<24} "
        f"{move[2]} vs {alone[2]}{repeat}{seen}"
    )


if __name__ == "__main__":
    sys.exit(main())
