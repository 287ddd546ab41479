"""responses.stops on recorded-shape responses: a stop request's text, finish and count, and
where its move fell against the string (tests/vllm_cpu/test_wrong_contexts.py breaks a stop on
the real engine)."""

import pytest

from handoff.backend import Shape
from handoff.client import Chunk, Request, Response, Stop
from handoff.continuity import Migration, Takeover
from handoff.errors import HandoffError
from handoff.responses import stops
from handoff.verdict import completion_problems

PROMPT = 10
STOP = Stop("w5 w6 w7", begins=5, ends=8)
REFERENCE = "".join(f" w{i}" for i in range(12))
OWED, NAME = stops.owed_before((REFERENCE, "the reference"), STOP)
REQUEST = Request("completion", True, "m", "p", 12, stop=STOP)


def response(text: str = OWED, finishes: int = 1, prompt: int | None = PROMPT + 6) -> Response:
    chunks = [Chunk(0.0, {"choices": [{"text": text, "finish_reason": None}]})]
    chunks += [Chunk(0.0, {"choices": [{"text": "", "finish_reason": "stop"}]})] * finishes
    usage = {"completion_tokens": STOP.ends} | ({} if prompt is None else {"prompt_tokens": prompt})
    chunks.append(Chunk(0.0, {"choices": [], "usage": usage}))
    return Response(status=200, chunks=chunks, done=True, streamed=True)


TAKEN = Takeover("worker-1-aggregate", 1.0)


def check(found: Response, moved: bool = True, **migration):
    migration = {"prompt_tokens": PROMPT, "takeover": TAKEN} | migration
    moving = Migration(fault_at=0.0, moved=moved, **migration)
    return stops.check(REQUEST, found, OWED, NAME, moving)


def test_the_owed_text_ends_before_the_string_and_the_request_sends_it_without_ignore_eos():
    assert OWED == " w0 w1 w2 w3 w4 "
    assert NAME == "the reference before its stop string"
    body = REQUEST.body()
    assert body["stop"] == ["w5 w6 w7"] and body["ignore_eos"] is False
    assert REQUEST.ends == (8, "stop")
    assert Request("completion", True, "m", "p", 12).ends == (12, "length")


def test_a_move_inside_the_string_with_the_owed_text_passes_with_a_note():
    found = check(response())
    assert found.problems == [] and found.unproven == []
    assert found.notes == [
        "the move carried 6 tokens, inside the stop string (tokens 6-8): its match ended as owed"
    ]


@pytest.mark.parametrize(
    "text", [OWED + "w5 w6 w7 w8", OWED.rstrip(), " w0 w1 w9 w3 w4 ", " w0 w1 w2 w3 w4 w5"]
)
def test_any_other_text_fails_where_it_departs(text):
    (problem,) = check(response(text)).problems
    assert problem.startswith("the text departs from the reference before its stop string at ")


def test_a_response_that_ran_past_its_stop_fails_by_finish_and_count():
    ran_on = Response(
        status=200,
        chunks=[
            Chunk(0.0, {"choices": [{"text": REFERENCE, "finish_reason": "length"}]}),
            Chunk(0.0, {"choices": [], "usage": {"completion_tokens": 12}}),
        ],
        done=True,
        streamed=True,
    )
    assert completion_problems(ran_on, *REQUEST.ends) == [
        "finish_reason 'length', expected 'stop'",
        "12 completion tokens in usage, expected 8",
    ]


def test_two_finish_reasons_fail():
    assert check(response(finishes=2)).problems == ["2 finish reasons in the response, expected 1"]


@pytest.mark.parametrize("carried", [0, 3, 5])
def test_a_move_before_the_string_began_is_not_proven(carried):
    found = check(response(prompt=PROMPT + carried))
    assert found.problems == []
    assert found.unproven == [
        f"the move carried {carried} tokens, the stop string begins after 5: its match did "
        f"not span the move"
    ]


def test_a_move_whose_place_is_unknown_is_not_proven():
    assert check(response(prompt=None)).unproven == [
        "where the move fell is unknown: the response's usage has no prompt_tokens"
    ]


def test_no_move_leaves_the_counters_to_judge():
    found = check(response(), moved=False)
    assert (found.problems, found.unproven, found.notes) == ([], [], [])


def test_a_stop_string_outside_the_reference_is_an_error():
    with pytest.raises(HandoffError, match="the stop string is not in the reference"):
        stops.owed_before((REFERENCE, "the reference"), Stop("w99", 1, 2))


def test_an_unknown_owed_text_is_not_proven():
    found = stops.check(REQUEST, response(), None, NAME, Migration(PROMPT, 0.0, TAKEN))
    assert found.unproven == ["the text before the stop string is unknown: nothing to compare"]


def test_a_prompt_the_frontend_did_not_count_is_not_proven():
    """A metric gone (read as 0) would make the whole usage look carried."""
    assert check(response(), prompt_tokens=0).unproven == [
        "where the move fell is unknown: the frontend counted 0 prompt tokens"
    ]


def test_a_move_no_other_worker_received_fails():
    assert check(response(), takeover=None).problems == [
        "the frontend counted a move that carried 6 tokens, but no worker but the faulted one "
        "logged receiving the request"
    ]


def test_a_move_after_the_whole_string_fails():
    assert check(response(prompt=PROMPT + 8)).problems == [
        "the move carried 8 tokens, the whole stop string (8): the faulted worker had ended "
        "it, and the response should have stopped before the fault"
    ]


def test_tokens_received_before_the_fault_and_lost_from_the_context_fail():
    (problem,) = check(response(), carried_at_least=7).problems
    assert problem.endswith("1 lost at the migration")


def test_an_id_changed_mid_stream_fails():
    changed = response()
    changed.chunks[0].data["id"] = "one"
    changed.chunks[1].data["id"] = "two"
    assert check(changed).problems[0].startswith("the response changed its id mid-stream")


AFTER = Stop("w5 w6 w7", begins=5, ends=8, spans=False)


@pytest.mark.parametrize(("carried", "where"), [(3, "notes"), (5, "unproven"), (6, "unproven")])
def test_a_string_after_the_move_needs_the_move_before_it(carried, where):
    after = Request("completion", True, "m", "p", 12, stop=AFTER)
    moving = Migration(PROMPT, 0.0, TAKEN)
    found = stops.check(after, response(prompt=PROMPT + carried), OWED, NAME, moving)
    assert found.problems == [] and len(getattr(found, where)) == 1, found
    if where == "notes":
        assert found.notes[0].startswith("the move carried 3 tokens, before the stop string")


class Words:
    """A backend whose reference output is `words`, one a token."""

    name = "words"

    def __init__(self, words: list[str]) -> None:
        self.words = words

    def stop_text(self, api, shape, begins, ends):
        return " ".join(self.words[begins:ends])


SHAPE = Shape("p", 4, 40)  # min_tokens 20: a first string at tokens 16-17, the second at 20-21
DISTINCT = [f"w{i}" for i in range(40)]


def test_min_tokens_covers_the_first_string_and_the_response_ends_at_the_second():
    stop = stops.planned(Words(DISTINCT), "completion", SHAPE, 5, "min_tokens")
    assert (stop.skipped, stop.skipped_begins, stop.min_tokens) == ("w16 w17", 16, 20)
    assert (stop.text, stop.begins, stop.ends, stop.spans) == ("w20 w21", 20, 22, False)
    body = Request("completion", True, "m", "p", 40, stop=stop).body()
    assert body["stop"] == ["w16 w17", "w20 w21"] and body["min_tokens"] == 20
    assert body["ignore_eos"] is False
    assert "min_tokens" not in REQUEST.body()


@pytest.mark.parametrize(
    ("at", "word"),
    [(3, "w20"), (18, "w16"), (20, "w16")],
    ids=["the second string earlier", "the first again, ending at min_tokens", "the same two"],
)
def test_stop_strings_that_match_again_cannot_plan_a_min_tokens_case(at, word):
    words = list(DISTINCT)
    words[at : at + 2] = [word, f"w{int(word[1:]) + 1}"]
    with pytest.raises(HandoffError, match="match again where planned only once"):
        stops.planned(Words(words), "completion", SHAPE, 5, "min_tokens")


@pytest.mark.parametrize(("carried", "where"), [(15, "notes"), (16, "unproven")])
def test_a_min_tokens_move_must_come_before_the_first_string(carried, where):
    stop = stops.planned(Words(DISTINCT), "completion", SHAPE, 5, "min_tokens")
    request = Request("completion", True, "m", "p", 40, stop=stop)
    found = stops.check(
        request, response(prompt=PROMPT + carried), OWED, NAME, Migration(PROMPT, 0.0, TAKEN)
    )
    assert len(getattr(found, where)) == 1, found
    if where == "notes":
        assert found.notes[0] == (
            "the move carried 15 tokens, before the stop strings: the first (tokens 17-18) "
            "passed, inside min_tokens 20; the second (tokens 21-22) ended it as owed"
        )
