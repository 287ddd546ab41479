"""handoff's client over a real socket: recorded frontend responses, and SSE the way the spec
allows a server to send it (a payload over several `data:` lines, events split across
chunks), read without losing or inventing a frame."""

import pytest
from frontend_replay import SSE, events, fetch, recorded, replay

from handoff.policies import OUTCOMES
from handoff.verdict import response_problems

MIGRATED = recorded("migrated_stream")
ENABLED = OUTCOMES[("decoding", "migration_enabled")]


def test_a_recorded_migrated_stream_is_read_whole():
    response = replay("migrated_stream")
    assert (response.status, response.done, response.protocol_errors) == (200, True, [])
    assert response.content_chunks == MIGRATED["request"]["max_tokens"] == 200
    assert (response.completion_tokens, response.finish_reason) == (200, "length")
    assert response.usage["prompt_tokens"] == 40


def test_a_payload_over_several_data_lines_is_one_frame():
    """The spec joins the `data` lines of one event with newlines; a comment line and an
    event split over three chunks change nothing."""
    pieces = [
        ': keep-alive\n\ndata: {"choices": [{"delta": {"content": " a"},\n',
        'data:  "finish_reason": "length"}],\ndata: "usage": {"completion_',
        'tokens": 1}}\n\ndata: [DONE]\n\n',
    ]
    response = fetch(200, SSE, pieces, stream=True)
    assert response.protocol_errors == []
    assert len(response.chunks) == 1
    assert (response.text, response.finish_reason) == (" a", "length")
    assert response.completion_tokens == 1
    assert response.done


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_a_frame_that_is_not_json_fails_the_case_by_name(stream):
    """Never an empty chunk: the frame is named, and the otherwise whole response fails."""
    frames = events(MIGRATED["body"])
    if stream:
        response = fetch(200, SSE, [*frames[:5], "data: <html>busy</html>\n\n", *frames[5:]], True)
        what = "an SSE frame"
    else:
        response = fetch(200, "application/json", ["<html>busy</html>"], False)
        what = "the response body"
    assert response.protocol_errors == [f"{what} is not a JSON object: '<html>busy</html>'"]
    assert f"the frontend broke the protocol: {what} is not a JSON object" in " ".join(
        response_problems(ENABLED, "migration_enabled", response, 200)
    )
    if stream:
        assert response.content_chunks == 200 and response.done


def test_a_stream_without_its_done_frame_fails_naming_it():
    """Every token, the usage and finish: all there but `[DONE]`, the end of the stream."""
    body = MIGRATED["body"]
    assert body.endswith("data: [DONE]\n\n")
    response = replay("migrated_stream", body.removesuffix("data: [DONE]\n\n"))
    assert response.content_chunks == 200 and not response.done
    assert response_problems(ENABLED, "migration_enabled", response, 200) == [
        "the stream ended without its closing data: [DONE] frame"
    ]
    assert response_problems(ENABLED, "migration_enabled", replay("migrated_stream"), 200) == []
