"""responses.sampled on recorded-shape responses: a sampling request's text after a move, named
by the one wrong successor that may give it, not proven where a wrong successor may give the
reference's text or where two may give the user's, and the documented divergence explaining
its own reason alone (tests/vllm_cpu/test_sampling.py makes each happen on the real engine)."""

from __future__ import annotations

import pytest

from handoff.cases import topology
from handoff.client import Chunk, Response
from handoff.continuity import Continuity, Migration, Takeover
from handoff.policies import (
    KNOWN_DEFECTS,
    KNOWN_DIVERGENCES,
    NOT_GIVEN,
    RESUMED_AFRESH,
    RESUMED_AFRESH_WITNESS,
)
from handoff.responses import sampled
from handoff.responses.sampled import DEPARTS

PROMPT, CARRIED = 10, 4
REFERENCE = " w1 w2 w3 w4 w5 w6 w7 w8"
AFRESH = " w1 w2 w3 w4 w9 w9 w9 w9"
UNGIVEN = " w1 w2 w3 w4 w5 w5 w5 w5"
#: The texts each wrong successor may give after CARRIED tokens.
GIVES = {RESUMED_AFRESH: {AFRESH}, NOT_GIVEN: {UNGIVEN}}
DEPARTURE = f"{DEPARTS} the reference at token 5: ..."


def response(text: str, prompt: int | None = PROMPT + CARRIED) -> Response:
    usage = {"completion_tokens": 8} | ({} if prompt is None else {"prompt_tokens": prompt})
    chunks = [Chunk(0.0, {"choices": [{"text": text, "finish_reason": "length"}], "usage": usage})]
    return Response(status=200, chunks=chunks, done=True, streamed=False)


def judged(text: str, undecided: str | None = None, gives=GIVES, moved=True, **usage):
    def follows(carried: int, way: str, given: str) -> bool:
        assert carried == CARRIED
        return given in gives[way]

    found = Continuity(problems=[] if text == REFERENCE else [DEPARTURE])
    migration = Migration(PROMPT, 0.0, Takeover("worker-1-aggregate", 1.0), moved)
    drawn = sampled.Sampled(undecided, tuple(gives), follows)
    sampled.check(found, response(text, **usage), REFERENCE, drawn, migration)
    return found


@pytest.mark.parametrize(("text", "way"), [(AFRESH, RESUMED_AFRESH), (UNGIVEN, NOT_GIVEN)])
def test_a_text_one_wrong_successor_gives_is_named_by_it(text, way):
    found = judged(text)
    assert len(found.problems) == 1 and found.problems[0].startswith(f"{way}: "), found.problems
    assert (
        f"after the {CARRIED} tokens the move carried, token for token ({DEPARTS}"
        in (found.problems[0])
    )


def test_a_text_two_wrong_successors_may_give_leaves_its_cause_unproven_and_fails():
    """The two agree on the first token after the move: a text they both may give does not say
    which went wrong, so the documented one cannot claim it."""
    found = judged(AFRESH, gives={RESUMED_AFRESH: {AFRESH}, NOT_GIVEN: {AFRESH}})
    assert found.problems == [DEPARTURE]
    assert found.unproven and "the case cannot tell which" in found.unproven[0]


def test_a_text_that_is_no_ones_stays_a_departure():
    found = judged(" w1 w2 w3 w4 w7 w7 w7 w7")
    assert found.problems == [DEPARTURE] and not found.unproven


def test_the_reference_where_no_wrong_successor_gives_it_is_a_kept_state():
    found = judged(REFERENCE)
    assert not found.problems and not found.unproven
    assert found.notes[-1].startswith("the text is the reference's, which no wrong successor")


@pytest.mark.parametrize("same", [RESUMED_AFRESH, NOT_GIVEN])
def test_where_a_wrong_successor_may_give_the_reference_the_case_cannot_tell_it(same):
    """A documented divergence that this move happens not to show must not pass for its fix."""
    found = judged(REFERENCE, gives={**GIVES, same: {REFERENCE}})
    assert found.unproven and found.unproven[0].startswith(f"{same} may give the reference's")
    assert not found.problems


def test_with_no_wrong_successor_known_the_case_cannot_tell():
    found = judged(REFERENCE, gives={})
    assert found.unproven and "the case cannot tell" in found.unproven[0]


def test_an_undecided_reference_is_not_proven_whatever_the_text():
    found = judged(REFERENCE, undecided="within 0.0001 of the next best")
    assert found.unproven == ["within 0.0001 of the next best"]


def test_a_move_whose_place_is_unknown_is_not_proven():
    found = judged(AFRESH, prompt=None)
    assert found.unproven and "where the move fell is unknown" in found.unproven[0]
    assert found.problems == [DEPARTURE]  # the text is still wrong


def test_no_move_leaves_the_text_to_the_reference_alone():
    found = judged(AFRESH, moved=False)
    assert found.problems == [DEPARTURE] and not found.unproven


@pytest.mark.parametrize("topology", sorted(KNOWN_DIVERGENCES))
def test_the_documented_divergence_explains_its_own_reason_alone(topology):
    defect = KNOWN_DIVERGENCES[topology]
    afresh, ungiven, plain = (judged(t).problems[0] for t in (AFRESH, UNGIVEN, " w1 w7"))
    assert defect.unexplained([afresh]) == []
    assert defect.unexplained([ungiven]) == [ungiven]
    assert defect.unexplained([plain]) == [plain]
    assert "PR 13600" in defect.issue or defect.issue.startswith("handoff finding")


def test_a_text_one_wrong_successor_gives_is_the_divergences_witness():
    found = judged(AFRESH)
    seen, said = found.witnessed[RESUMED_AFRESH_WITNESS.key]
    assert seen and "sampling state began there" in said
    assert judged(UNGIVEN).witnessed == {}


def test_a_divergence_of_a_topology_shadows_no_faults_own_defect():
    """`known_defect` takes a topology's documented divergence before a fault's defect: no
    fault a sampling topology runs may have one of its own."""
    for name in KNOWN_DIVERGENCES:
        assert not set(topology(name).allowed()["fault"]) & set(KNOWN_DEFECTS), name
