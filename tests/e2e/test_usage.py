"""What a moved request is told of its prompt, on Dynamo's frontend and mocker workers: 1.6.1
tells it the re-issued context (the prompt and the tokens carried), and the usage case fails
for that reason and no other; the same check passes a response told its own prompt, and a
case where nothing moved mid-stream is not proven."""

from handoff import runner
from handoff.cases import Case
from handoff.client import Chunk, Response
from handoff.responses.evidence import usage_problems
from handoff.runner import Settings
from handoff_mocker import MockerBackend

MOVED = Case.from_id("worker_failure-completion-stream-tcp", "usage")


def test_a_moved_request_is_told_of_prompt_tokens_it_never_sent(tmp_path):
    """Judged against the same prompt sent undisturbed, which the harness's own count of the
    prompt agrees with: not against a number of the frontend's that might share the defect."""
    result = runner.run_case(MockerBackend(), MOVED, tmp_path, Settings(), 90)
    assert not result.verdict.passed and not result.verdict.unproven, result.verdict
    (reason,) = result.verdict.reasons
    events = {e.name: e.data for e in result.history.events}
    alone = events["undisturbed_usage"]["prompt_tokens"]
    assert alone == events["request_sent"]["prompt_tokens"]
    told = int(reason.split()[2])
    assert told > alone, reason
    assert reason == (
        f"usage.prompt_tokens is {told} after the move, but the same prompt undisturbed is "
        f"told {alone}: the user is told of {told - alone} more, the re-issued context's"
    )


def told(prompt_tokens: int) -> Response:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 900}
    return Response(chunks=[Chunk(0.0, {"id": "cmpl-1", "choices": [], "usage": usage})])


def test_a_response_told_its_own_prompt_passes_and_one_never_moved_is_not_proven():
    assert usage_problems(told(32), 32, moved=True) == ([], "")
    assert usage_problems(told(46), 32, moved=True)[0]
    problems, unseen = usage_problems(told(46), 32, moved=False)
    assert problems == [] and "no move" in unseen
