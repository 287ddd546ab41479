"""Token continuity, checked on a real migrated stream recorded from the mocker (one worker
SIGKILLed mid-stream), then on the same stream with one frame dropped or repeated."""

import copy
import json
from pathlib import Path

import pytest

from handoff.client import Chunk, Response
from handoff.continuity import check, differing_token, first_divergence
from handoff_mocker import MockerBackend

RECORDED = json.loads((Path(__file__).parent / "data" / "migrated_stream.json").read_text())
COUNT = MockerBackend().output_tokens


def recorded() -> Response:
    chunks = [Chunk(c["at"], copy.deepcopy(c["data"])) for c in RECORDED["chunks"]]
    return Response(status=RECORDED["status"], chunks=chunks, done=RECORDED["done"])


def after_fault() -> int:
    """The index of the first frame the client received after the fault."""
    return next(i for i, c in enumerate(RECORDED["chunks"]) if c["at"] >= RECORDED["fault_at"])


def test_the_recorded_migrated_stream_is_continuous():
    result = check(recorded(), RECORDED["max_tokens"], COUNT)
    assert result.problems == []
    assert result.notes == ["content not compared with a baseline: the output is not deterministic"]


def test_a_frame_dropped_at_the_fault_is_caught():
    response = recorded()
    del response.chunks[after_fault()]
    assert check(response, RECORDED["max_tokens"], COUNT).problems == [
        "the client received 199 tokens, expected 200: 1 lost",
        "usage says 200 completion tokens, the client received 199",
    ]


def test_a_frame_repeated_at_the_fault_is_caught():
    response = recorded()
    at = after_fault()
    response.chunks.insert(at, copy.deepcopy(response.chunks[at - 1]))
    assert check(response, RECORDED["max_tokens"], COUNT).problems == [
        "the client received 201 tokens, expected 200: 1 repeated",
        "usage says 200 completion tokens, the client received 201",
    ]


def test_two_tokens_in_one_frame_and_a_second_finish_are_caught():
    response = recorded()
    at = after_fault()
    merged = response.chunks[at]
    merged.data["choices"][0]["text"] += response.chunks[at + 1].text
    del response.chunks[at + 1]
    response.chunks.insert(5, copy.deepcopy(response.chunks[-2]))  # a finish reason mid-stream
    problems = check(response, RECORDED["max_tokens"], COUNT, one_token_per_frame=True).problems
    assert "2 finish reasons in the response, expected 1" in problems
    assert f"content frame {at + 1} holds 2 tokens, expected 1" in problems
    # A real engine may coalesce two tokens into one frame: counted, not a problem.
    merged_only = check(response, RECORDED["max_tokens"], COUNT).problems
    assert merged_only == ["2 finish reasons in the response, expected 1"]


def test_a_changed_response_id_is_caught():
    response = recorded()
    response.chunks[-3].data["id"] = "cmpl-another"
    assert (
        check(response, RECORDED["max_tokens"], COUNT)
        .problems[0]
        .startswith("the response changed its id mid-stream")
    )


def test_a_deterministic_baseline_names_the_first_divergence():
    response = recorded()
    baseline = response.text
    assert check(response, RECORDED["max_tokens"], COUNT, baseline).notes == [
        "the migrated text equals the undisturbed baseline exactly"
    ]
    at = after_fault()
    response.chunks[at].data["choices"][0]["text"] = " t9999"
    (problem,) = check(response, RECORDED["max_tokens"], COUNT, baseline).problems
    where = len("".join(c.text for c in response.chunks[:at])) + 2
    assert problem.startswith(f"the migrated text departs from the undisturbed baseline at "
                              f"token {at + 1} (character {where}): ")  # fmt: skip


@pytest.mark.parametrize(
    ("expected", "received", "token"),
    [(" t5 t6 t7", " t5 t9 t7", 2), (" t5 t6", " t5 t66", 2), (" t5 t6", " t5 t6 t7", 3),
     (" t5 t6 t7", " t8", 1)],
)  # fmt: skip
def test_the_differing_token_is_counted_from_one(expected, received, token):
    at = first_divergence(expected, received)
    assert differing_token(expected, received, at, COUNT) == token


def test_without_a_token_counter_only_usage_and_finish_are_checked():
    result = check(recorded(), RECORDED["max_tokens"], lambda text: None)
    assert result.problems == []
    assert any("tokens not counted in the text" in n for n in result.notes)


@pytest.mark.parametrize(
    ("a", "b", "at"), [("abc", "abc", None), ("abc", "abd", 2), ("abc", "ab", 2), ("", "x", 0)]
)
def test_first_divergence(a, b, at):
    assert first_divergence(a, b) == at
