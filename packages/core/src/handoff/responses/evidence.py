"""The evidence every request of every workload gets once its response has ended, so that no
workload can skip a check: what the user got against the policy (verdict.request_problems),
and, for a response that completed, its tokens against the reference or baseline, their
log-probabilities against the backend's computation of the model, its guide, and, after a move,
the context the frontend re-issued (continuity)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from handoff import continuity
from handoff.backend import Backend, LogprobJudge, Shape, Worker
from handoff.cases import Case, topology
from handoff.client import Request, Response
from handoff.deployment import Deployment
from handoff.history import History
from handoff.machine import worker_logs
from handoff.policies import Outcome
from handoff.responses import sampled, stops
from handoff.verdict import request_problems


@dataclass(frozen=True)
class Owed:
    """What one request owes: the text it must give, where handoff knows it, and what that text
    is called (`waits.REFERENCE` or `waits.BASELINE`)."""

    text: str | None
    compared_with: str
    #: Judges the top log-probabilities of each token, where the request asked for them.
    logprobs: LogprobJudge | None = None
    #: What a sampling request's text needs judged beside the reference (`responses.sampled`).
    sampled: sampled.Sampled | None = None


#: A request whose text handoff does not know (a random engine, several choices).
NO_TEXT = Owed(None, "")


def owing(backend: Backend, request: Request, shape: Shape, text: tuple[str | None, str]) -> Owed:
    """What `request` owes: `text` and what it is called (`waits.reference_text`), and where it
    asked for log-probabilities, the backend's judge of them."""
    judge = backend.logprob_judge(request.api, shape) if request.top_logprobs else None
    drawn = None
    if shape.sampling is not None:
        undecided = backend.undecided(request.api, shape)
        ways = backend.wrong_successors(request.api, shape)
        drawn = sampled.Sampled(undecided, ways, partial(backend.follows, request.api, shape))
    return Owed(*text, logprobs=judge, sampled=drawn)


def judged(
    request: Request,
    response: Response,
    owed: Owed,
    outcome: Outcome,
    policy_name: str,
    cut: bool,
    backend: Backend,
    moved: Callable[[], continuity.Migration | None],
) -> continuity.Continuity:
    """One request against its promise: a request the fault `cut` ends as `outcome` says; any
    other completes whatever the policy, and is judged whole (`checked_content`)."""
    found = checked_content(request, response, owed, outcome.completes or not cut, backend, moved)
    tokens, finish = request.ends
    found.problems[:0] = request_problems(outcome, policy_name, response, tokens, cut, finish)
    return found


def checked_content(
    request: Request,
    response: Response,
    owed: Owed,
    completes: bool,
    backend: Backend,
    moved: Callable[[], continuity.Migration | None],
) -> continuity.Continuity:
    """A response that `completes` by its promise, and did, judged whole (`content`), with the
    re-issued context that `moved` gives where it moved; any other by what it delivered before
    its end (`continuity.delivered`), each token it delivered by its log-probabilities too."""
    if completes and response.status == 200 and response.error is None:
        return content(request, response, owed, backend, moved())
    found = continuity.delivered(
        response, backend.output_tokens, owed.text, owed.compared_with,
        ids=backend.output_token_ids, origin=backend.token_origin if request.annotated else None,
    )  # fmt: skip
    found.problems += told_logprobs(request, response, owed, backend, completed=False)
    if request.guide is not None and not backend.decodes_guides:
        found.notes.append(guide_unchecked(backend))
    return found


def content(
    request: Request,
    response: Response,
    owed: Owed,
    backend: Backend,
    migration: continuity.Migration | None,
) -> continuity.Continuity:
    """A completed response's tokens, its text against what it owes (a stop request's by its
    own rule: `stops.check`), every token's log-probabilities, its guide, and after a move its
    re-issued context."""
    if request.stop is not None:
        kept = stops.check(request, response, owed.text, owed.compared_with, migration)
    else:
        kept = continuity.check(
            response,
            request.max_tokens,
            backend.output_tokens,
            baseline=owed.text,
            why_no_baseline=backend.nondeterministic_because,
            compared_with=owed.compared_with,
            one_token_per_frame=backend.one_token_per_frame,
            migration=migration,
            ids=backend.output_token_ids,
            origin=backend.token_origin if request.annotated else None,
        )
    kept.problems += told_logprobs(request, response, owed, backend, completed=True)
    if owed.sampled is not None:
        sampled.check(kept, response, owed.text, owed.sampled, migration)
    if request.guide is not None and not backend.decodes_guides:
        kept.notes.append(guide_unchecked(backend))
    elif request.guide is not None:
        kept.problems += guided_problems(request, response.text, owed.text)
    return kept


def told_logprobs(
    request: Request, response: Response, owed: Owed, backend: Backend, completed: bool
) -> list[str]:
    """Every token the client was told of, judged by its log-probabilities where the request
    asked (`logprob_problems`): a `completed` response's with the stop string the frontend held
    back at its end (`stops.held_back`); a cut one's, those it delivered, where it delivered
    any. A stop request cut inside its string has entries for the tokens held back there, whose
    words the client was never told: the count then fails, as the response already does."""
    if owed.logprobs is None or not (completed or response.text):
        return []
    held = stops.held_back(request, response) if completed else ""
    count = backend.output_tokens
    return logprob_problems(response, request.top_logprobs, owed.logprobs, count, held)


def logprob_problems(
    response: Response,
    asked: int,
    judge: LogprobJudge,
    count: continuity.TokenCounter,
    held: str = "",
) -> list[str]:
    """Where the response's log-probabilities depart from the backend's computation, judged
    after its text and `held`, what the frontend held back of it (a stop string: Dynamo sends
    the log-probabilities of its tokens, not their text). A response that carries none, though
    asked, or carries them for other than those tokens (where `count` counts them), fails: a
    reading that is missing is no agreement."""
    observed = response.top_logprobs
    if observed is None:
        return [f"the response carries no log-probabilities; the request asked for {asked}"]
    text = response.text + held
    if (told := count(text)) is not None and len(observed) != told:
        shown = count(response.text) or 0
        held_back = f" and {told - shown} held back in its stop string" if held else ""
        return [
            f"{len(observed)} tokens carry log-probabilities; the client received {shown}"
            f"{held_back}"
        ]
    departure = judge(observed, text)
    return [departure] if departure else []


def usage_problems(response: Response, undisturbed: int, moved: bool) -> tuple[list[str], str]:
    """What the user is told of its prompt after a move against what an undisturbed request of
    the same prompt is told (`undisturbed`): a move must be invisible to the client (Dynamo's
    request-migration page). The problems, and why the check could not be made (no move of a
    request that had streamed tokens, nothing to judge), else ""."""
    if not moved:
        return [], "the frontend counted no move of a decoding request: nothing carried to tell"
    told = (response.usage or {}).get("prompt_tokens")
    if told is None:
        return ["the response has no usage.prompt_tokens: what the user is told is unknown"], ""
    if told != undisturbed:
        return [
            f"usage.prompt_tokens is {told} after the move, but the same prompt undisturbed is "
            f"told {undisturbed}: the user is told of {told - undisturbed} more, the re-issued "
            f"context's"
        ], ""
    return [], ""


def guide_unchecked(backend: Backend) -> str:
    return f"{backend.name} does not decode guided output: its text is not checked"


def guided_problems(request: Request, text: str, expected_text: str | None) -> list[str]:
    """Where a guided response's text leaves its guide, and where it departs from the
    reference (or baseline), each named by its first bad character."""
    problems = [broken] if request.guide and (broken := request.guide.broken(text)) else []
    at = continuity.first_divergence(expected_text, text) if expected_text is not None else None
    if at is not None:
        problems.append(
            f"the guided output departs from the reference at character {at + 1}: "
            f"{expected_text[at : at + 40]!r} expected, {text[at : at + 40]!r} received"
        )
    return problems


def migration_evidence(
    deployment: Deployment,
    case: Case,
    request_made: Request,
    holder: Worker,
    response: Response,
    prompt: float,
    moved: bool,
    history: History,
    carried_at_least: int = 0,
    **label: object,
) -> continuity.Migration:
    """What the re-issued context is judged with beside the stream: the prompt's length as the
    frontend tokenized it (`prompt`), when the fault was sent, which other worker of the faulted
    role logged receiving it, whether the frontend counted a move, what that worker's engine
    holds after the prompt of `request_made` (`Backend.received_context`), and the least time
    any first token of the case takes (its simulated KV transfer); `carried_at_least`: the
    tokens the frontend had received before the fault, where known. `label` goes on the
    history's event: which of many requests it was."""
    backend, role = deployment.backend, topology(case.topology).target_role
    # The last fault: a race case's trials share one history.
    fault_at = history.started + next(
        e.at for e in reversed(history.events) if e.name == "fault_sent"
    )
    others = {w.name: w for w in deployment.serving if w.role == role and w is not holder}
    logs = {name: w.process.log_path for name, w in others.items()}
    response_id = response.chunks[0].data.get("id") if response.chunks else None
    taken = continuity.takeover(logs, str(response_id)) if response_id else None
    received = (
        backend.received_context(others[taken.worker], request_made.prompt) if taken else None
    )
    history.record(
        "takeover_seen",
        prompt_tokens=int(prompt),
        worker=taken.worker if taken else None,
        received_at=round(taken.received_at - history.started, 4) if taken else None,
        moved=moved,
        received_tokens=None if received is None else len(received),
        **label,
    )
    floor = backend.kv_transfer_floor_s(case)
    served = None
    if response_id:  # every worker that received it, in order: after two moves, three
        wanted = continuity.request_id(str(response_id))
        by_name = {holder.name: holder, **others}
        names = worker_logs.received(by_name.values(), {wanted}).get(wanted, [])
        served = numbered(deployment, names)
    return continuity.Migration(
        int(prompt), fault_at, taken, moved, received, floor, carried_at_least, served
    )


def numbered(deployment: Deployment, names: list[str]) -> list[tuple[str, int]] | None:
    """The workers named, each with the number its tokens name (`Backend.token_worker`); None
    where one is unknown, or shared with another worker of the deployment (a pool's folder
    after many replacements): a run of the one could not be told from the other's."""
    numbers = {w.name: deployment.backend.token_worker(w) for w in deployment.serving}
    wanted = [numbers.get(name) for name in names]
    workers_of = Counter(numbers.values())
    if None in wanted or any(workers_of[number] > 1 for number in wanted):
        return None
    return [
        (name, number) for name, number in zip(names, wanted, strict=True) if number is not None
    ]
