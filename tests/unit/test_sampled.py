"""responses.sampled on recorded-shape responses: a sampling request's text after a move, named
by the wrong successor whose text it is exactly, not proven where no wrong successor's text
differs from the reference, and the documented divergence explaining its own reason alone
(tests/vllm_cpu/test_sampling.py makes each happen on the real engine)."""

from __future__ import annotations

import pytest

from handoff.client import Chunk, Response
from handoff.continuity import Continuity, Migration, Takeover
from handoff.policies import KNOWN_DIVERGENCES, NOT_GIVEN, RESUMED_AFRESH
from handoff.responses import sampled
from handoff.responses.sampled import DEPARTS

PROMPT, CARRIED = 10, 4
REFERENCE = " w1 w2 w3 w4 w5 w6 w7 w8"
AFRESH = " w1 w2 w3 w4 w9 w9 w9 w9"
UNGIVEN = " w1 w2 w3 w4 w5 w5 w5 w5"


def response(text: str, prompt: int | None = PROMPT + CARRIED) -> Response:
    usage = {"completion_tokens": 8} | ({} if prompt is None else {"prompt_tokens": prompt})
    chunks = [Chunk(0.0, {"choices": [{"text": text, "finish_reason": "length"}], "usage": usage})]
    return Response(status=200, chunks=chunks, done=True, streamed=False)


def wrong(carried: int) -> dict[str, tuple[str, int]]:
    assert carried == CARRIED
    return {RESUMED_AFRESH: (AFRESH, len(AFRESH)), NOT_GIVEN: (UNGIVEN, len(UNGIVEN))}


def judged(text: str, undecided: str | None = None, gives=wrong, moved=True, **usage):
    departs = [] if text == REFERENCE else [f"{DEPARTS} the reference at token 5: ..."]
    found = Continuity(problems=departs)
    migration = Migration(PROMPT, 0.0, Takeover("worker-1-aggregate", 1.0), moved)
    sampled.check(
        found, response(text, **usage), REFERENCE, sampled.Sampled(undecided, gives), migration
    )
    return found


@pytest.mark.parametrize(("text", "way"), [(AFRESH, RESUMED_AFRESH), (UNGIVEN, NOT_GIVEN)])
def test_a_text_that_is_a_wrong_successors_exactly_is_named_by_it(text, way):
    found = judged(text)
    assert len(found.problems) == 1 and found.problems[0].startswith(f"{way}: "), found.problems
    assert f"after the {CARRIED} tokens the move carried ({DEPARTS}" in found.problems[0]


def test_a_text_that_is_no_ones_stays_a_departure():
    found = judged(" w1 w2 w3 w4 w7 w7 w7 w7")
    assert found.problems == [f"{DEPARTS} the reference at token 5: ..."]


def test_the_reference_where_wrong_successors_differ_is_a_kept_state():
    found = judged(REFERENCE)
    assert not found.problems and not found.unproven
    assert found.notes[-1].startswith("the text is the reference's, not a wrong successor's")


@pytest.mark.parametrize("same", [RESUMED_AFRESH, NOT_GIVEN])
def test_where_one_wrong_successor_gives_the_reference_the_case_cannot_tell_it(same):
    """A documented divergence that this move happens not to show must not pass for its fix."""
    found = judged(REFERENCE, gives=lambda n: {**wrong(n), same: (REFERENCE, len(REFERENCE))})
    assert found.unproven and found.unproven[0].startswith(f"{same} gives the reference's text")
    assert not found.problems


def test_with_no_wrong_successor_known_the_case_cannot_tell():
    found = judged(REFERENCE, gives=lambda n: {})
    assert found.unproven and "the case cannot tell" in found.unproven[0]


def test_an_undecided_reference_is_not_proven_whatever_the_text():
    found = judged(REFERENCE, undecided="within 0.0001 of the next best")
    assert found.unproven == ["within 0.0001 of the next best"]


def test_a_move_whose_place_is_unknown_is_not_proven():
    found = judged(AFRESH, prompt=None)
    assert found.unproven and "where the move fell is unknown" in found.unproven[0]
    assert found.problems[0].startswith(DEPARTS)  # the text is still wrong


def test_no_move_leaves_the_text_to_the_reference_alone():
    found = judged(AFRESH, moved=False)
    assert found.problems == [f"{DEPARTS} the reference at token 5: ..."] and not found.unproven


@pytest.mark.parametrize("topology", sorted(KNOWN_DIVERGENCES))
def test_the_documented_divergence_explains_its_own_reason_alone(topology):
    defect = KNOWN_DIVERGENCES[topology]
    afresh, ungiven, plain = (judged(t).problems[0] for t in (AFRESH, UNGIVEN, " w1 w7"))
    assert defect.unexplained([afresh]) == []
    assert defect.unexplained([ungiven]) == [ungiven]
    assert defect.unexplained([plain]) == [plain]
    assert "PR 13600" in defect.issue


def test_a_wrong_successor_like_the_reference_up_to_a_close_call_is_not_proven():
    """Decided only as far as the reference's own text: the engine may go either way after."""
    found = judged(AFRESH, gives=lambda n: {**wrong(n), RESUMED_AFRESH: (AFRESH, 12)})
    assert found.unproven and "up to a close call" in found.unproven[0]


def test_a_text_that_is_a_wrong_successors_up_to_its_close_call_is_named_by_it():
    """Past the close call the engine may choose otherwise: the departure, decided before it,
    is the wrong successor's."""
    received = AFRESH[:-3] + " w7"
    found = judged(received, gives=lambda n: {**wrong(n), RESUMED_AFRESH: (AFRESH, 20)})
    assert found.problems[0].startswith(f"{RESUMED_AFRESH}: "), found.problems
    assert "up to its first close call (character 20)" in found.problems[0]
