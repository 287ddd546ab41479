"""Tokens that name their worker (handoff.responses.sequences, the mocker's replayed outputs):
a migrated response is its holder's output then the new worker's, each from its first token;
every way a frontend could lose, repeat, replace or reorder a token, anywhere in the response,
breaks a run or moves the boundary the re-issued context is judged by, and fails the check."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from handoff.client import Chunk, Response
from handoff.continuity import Migration, Takeover, check
from handoff.responses.sequences import runs
from handoff_mocker import MockerBackend
from handoff_mocker.origins import BASE, PERIOD, origin

MOCKER = MockerBackend()
PROMPT = 32
N = 600


def output(worker: int, length: int) -> list[int]:
    return [BASE + worker * PERIOD + i % PERIOD for i in range(length)]


def migrated(carried: int, holder: int = 0, successor: int = 1) -> list[int]:
    return output(holder, carried) + output(successor, N - carried)


def judged(ids: list[int], carried: int):
    """The continuity of a stream of `ids`, one a frame, its context `carried` tokens long."""
    chunks = [
        Chunk(float(n), {"id": "r", "choices": [{"text": f" t{t}"}]}) for n, t in enumerate(ids)
    ]
    chunks[-1].data["choices"][0]["finish_reason"] = "length"
    usage = {"prompt_tokens": PROMPT + carried, "completion_tokens": len(ids)}
    chunks.append(Chunk(float(len(ids)), {"id": "r", "choices": [], "usage": usage}))
    response = Response(status=200, chunks=chunks, done=True)
    moved = Migration(PROMPT, fault_at=0.0, takeover=Takeover("worker-1-aggregate", 0.0))
    return check(
        response, N, MOCKER.output_tokens, one_token_per_frame=True, migration=moved,
        ids=MOCKER.output_token_ids, origin=MOCKER.token_origin,
    )  # fmt: skip


def test_a_migrated_response_is_two_runs_each_from_its_first_token():
    told = runs(migrated(300), origin)
    assert told is not None and told.lengths == [300, 300] and told.problems == []
    result = judged(migrated(300), 300)
    assert result.problems == [] and result.unproven == []
    assert (
        "exactly the 300 tokens the client read before worker-1-aggregate's first"
        in (result.notes[0])
    )


def test_a_token_that_names_no_worker_tells_nothing():
    assert runs([*migrated(3)[:5], 1500], origin) is None
    assert runs([], origin) is None


def test_a_run_past_the_period_wraps_without_a_break():
    assert runs(output(2, 3 * PERIOD + 5), origin).lengths == [3 * PERIOD + 5]


PERTURBATIONS = ("drop", "repeat", "replace", "swap", "move")


def perturbed(ids: list[int], how: str, at: int) -> list[int]:
    at = min(at, len(ids) - 2)
    if how == "drop":
        return ids[:at] + ids[at + 1 :]
    if how == "repeat":
        return ids[: at + 1] + ids[at:]
    if how == "replace":  # another worker's token of the same place
        return [*ids[:at], ids[at] + 2 * PERIOD, *ids[at + 1 :]]
    if how == "swap":
        return [*ids[:at], ids[at + 1], ids[at], *ids[at + 2 :]]
    return ids[:at] + ids[at + 1 : at + 3] + [ids[at]] + ids[at + 3 :]  # moved two on


@given(
    carried=st.integers(1, N - 1),
    how=st.sampled_from(PERTURBATIONS),
    at=st.integers(0, N - 1),
)
def test_every_token_lost_repeated_replaced_or_reordered_anywhere_fails(carried, how, at):
    wrong = perturbed(migrated(carried), how, at)
    assert wrong != migrated(carried)
    assert judged(wrong, carried).problems, (how, at)


@given(carried=st.integers(1, N - 1), told=st.integers(0, N))
def test_a_context_of_other_than_the_tokens_before_the_new_workers_fails(carried, told):
    result = judged(migrated(carried), told)
    assert bool(result.problems) == (told != carried)
