"""Tokens that name their worker (handoff.sequences, the mocker's replayed outputs):
a migrated response is its holder's output then the new worker's, each from its first token;
every way a frontend could lose, repeat, replace or reorder a token, anywhere in the response,
breaks a run or moves the boundary the re-issued context is judged by, and fails the check."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import example, given
from hypothesis import strategies as st

from handoff.backend import Model
from handoff.cases import Case
from handoff.client import Chunk, Response
from handoff.continuity import Migration, Takeover, check
from handoff.responses.evidence import numbered
from handoff.sequences import Runs, runs, unserved
from handoff_mocker import MockerBackend
from handoff_mocker.origins import BASE, ENGINES, PERIOD, origin

MOCKER = MockerBackend()
PROMPT = 32
N = 600


#: The holder (worker #0) and the new worker (#1), as their logs received the request.
SERVED = [("worker-0-aggregate", 0), ("worker-1-aggregate", 1)]


def output(worker: int, length: int) -> list[int]:
    return [BASE + worker * PERIOD + i % PERIOD for i in range(length)]


def migrated(carried: int, holder: int = 0, successor: int = 1) -> list[int]:
    return output(holder, carried) + output(successor, N - carried)


def judged(ids: list[int], carried: int, served: list[tuple[str, int]] = SERVED):
    """The continuity of a stream of `ids`, one a frame, its context `carried` tokens long,
    received by the `served` workers in turn."""
    chunks = [
        Chunk(float(n), {"id": "r", "choices": [{"text": f" t{t}"}]}) for n, t in enumerate(ids)
    ]
    chunks[-1].data["choices"][0]["finish_reason"] = "length"
    usage = {"prompt_tokens": PROMPT + carried, "completion_tokens": len(ids)}
    chunks.append(Chunk(float(len(ids)), {"id": "r", "choices": [], "usage": usage}))
    response = Response(status=200, chunks=chunks, done=True)
    moved = Migration(
        PROMPT, fault_at=0.0, takeover=Takeover("worker-1-aggregate", 0.0), served=served
    )
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


def test_no_tokens_tell_nothing():
    assert runs([], origin) is None


def test_a_run_past_the_period_wraps_without_a_break():
    assert runs(output(2, 3 * PERIOD + 5), origin).lengths == [3 * PERIOD + 5]


PERTURBATIONS = ("drop", "repeat", "replace", "draw", "swap", "move")


def perturbed(ids: list[int], how: str, at: int) -> list[int]:
    at = min(at, len(ids) - 2)
    if how == "drop":
        return ids[:at] + ids[at + 1 :]
    if how == "repeat":
        return ids[: at + 1] + ids[at:]
    if how == "replace":  # another worker's token of the same place
        return [*ids[:at], ids[at] + 2 * PERIOD, *ids[at + 1 :]]
    if how == "draw":  # a token the mocker drew at random in its place
        return [*ids[:at], 1000 + ids[at] % 1000, *ids[at + 1 :]]
    if how == "swap":
        return [*ids[:at], ids[at + 1], ids[at], *ids[at + 2 :]]
    return ids[:at] + ids[at + 1 : at + 3] + [ids[at]] + ids[at + 3 :]  # moved two on


@given(
    carried=st.integers(1, N - 1),
    how=st.sampled_from(PERTURBATIONS),
    at=st.integers(0, N - 1),
)
# The holder's one token replaced by another worker's first: every run whole, only whose tells.
@example(carried=1, how="replace", at=0)
def test_every_token_lost_repeated_replaced_or_reordered_anywhere_fails(carried, how, at):
    wrong = perturbed(migrated(carried), how, at)
    assert wrong != migrated(carried)
    assert judged(wrong, carried).problems, (how, at)


@given(carried=st.integers(1, N - 1), told=st.integers(0, N))
def test_a_context_of_other_than_the_tokens_before_the_new_workers_fails(carried, told):
    result = judged(migrated(carried), told)
    assert bool(result.problems) == (told != carried)


def test_runs_are_of_the_workers_that_received_the_request_in_order():
    """A worker that received the request and generated nothing is passed over; a run of a
    worker that never received it, or out of the order the logs received it in, fails."""
    three = [("a", 0), ("b", 2), ("c", 1)]
    assert unserved(Runs([5, 5], [0, 1]), three) == []
    assert unserved(Runs([5, 5, 5], [0, 2, 1]), three) == []
    assert unserved(Runs([5, 5], [1, 2]), three) == [
        "the response's tokens came from workers #1, #2 in turn; only a (#0), b (#2), c (#1) "
        "received it"
    ]
    assert unserved(Runs([5, 5], [3, 1]), three)
    assert unserved(Runs([5, 5], [0, 0]), three)  # one worker's output twice, received once


def test_runs_whose_workers_are_not_known_for_certain_are_not_proven():
    """No number for a worker (or one two workers share): the check is not made, and says so."""
    result = judged(migrated(300), 300, served=None)
    assert result.problems == []
    assert result.unproven == [
        "whether each run of tokens is a worker's that received the request: the workers' "
        "numbers are not known for certain"
    ]


def test_a_token_no_worker_replayed_fails_and_tells_no_boundary():
    """A token replaced by a random draw (a worker not replaying: the annotation lost on the
    way), or by a word of the prompt: the count is unchanged, and only its origin tells."""
    for stranger in (1500, 100):
        wrong = migrated(300)
        wrong[450] = stranger
        told = runs(wrong, origin)
        assert told is not None and told.lengths == []
        assert told.problems == [
            f"1 token(s) name no worker, the first token 451 (id {stranger}): replaced, or "
            "generated by a worker that was not replaying its output"
        ]
        assert told.problems[0] in judged(wrong, 300).problems


def test_after_two_moves_the_context_is_every_token_before_the_last_workers():
    two = output(0, 100) + output(1, 200) + output(2, N - 300)
    assert runs(two, origin).lengths == [100, 200, N - 300]
    three = [*SERVED, ("worker-2-aggregate", 2)]
    assert judged(two, 300, three).problems == []
    assert judged(two, 100, three).problems == [
        "the client read 300 tokens before worker-1-aggregate's first (the token where the "
        "worker that generated them changes), but the re-issued context carried 100 "
        "(usage.prompt_tokens 132 - prompt 32): 200 replayed at the migration"
    ]


def test_a_unary_response_tells_its_boundary_by_its_tokens_too():
    ids = migrated(250)
    text = "".join(f" t{t}" for t in ids)
    choice = {"text": text, "finish_reason": "length"}
    usage = {"prompt_tokens": PROMPT + 249, "completion_tokens": N}
    response = Response(
        status=200, chunks=[Chunk(0.0, {"id": "r", "choices": [choice], "usage": usage})], done=True
    )
    moved = Migration(
        PROMPT, fault_at=0.0, takeover=Takeover("worker-1-aggregate", 0.0), served=SERVED
    )
    result = check(
        response, N, MOCKER.output_tokens, migration=moved,
        ids=MOCKER.output_token_ids, origin=MOCKER.token_origin,
    )  # fmt: skip
    assert [p for p in result.problems if "1 replayed at the migration" in p], result.problems


def worker_of(folder, port: int, name: str):
    """A mocker worker of an aggregate case as its launch would make it (no process runs)."""
    case = Case("migration_enabled", "worker_failure", "chat", "stream", "nats")
    launch = MOCKER.worker("aggregate", case, Model("m", folder), {"system": port}, folder)
    process = SimpleNamespace(argv=list(launch.argv))
    return SimpleNamespace(name=name, process=process)


def test_a_workers_number_is_its_traces_and_one_two_workers_share_is_no_number(tmp_path):
    """`token_worker` reads the number the worker replays; `numbered` gives none where another
    serving worker has it too (the ninth of a folder shares the first's)."""
    workers = [worker_of(tmp_path, 9000 + n, f"w{n}") for n in range(ENGINES + 1)]
    assert [MOCKER.token_worker(w) for w in workers] == [*range(ENGINES), 0]
    deployment = SimpleNamespace(backend=MOCKER, serving=workers[:2])
    assert numbered(deployment, ["w1", "w0"]) == [("w1", 1), ("w0", 0)]
    assert numbered(deployment, ["w7"]) is None  # not serving: unknown
    deployment.serving = workers
    assert numbered(deployment, ["w0", "w1"]) is None
