"""The top log-probabilities the client asks for and reads back, in both APIs' shapes as Dynamo's
frontend sent them (recorded from vLLM's CPU engine), and what the evidence makes of them: a
response that carries none, though asked, fails; a judge's departure fails the request. A stop
request's come for the string the frontend held back too, and are judged with it
(test_logprobs_on_every_path.py judges every path with the vLLM backend's own judge)."""

import json

import pytest
from frontend_replay import recorded, replay
from test_vllm_cpu import on_cpu

from handoff.client import Request, Response, Stop
from handoff.responses import evidence


def test_a_chat_stream_gives_each_tokens_top_in_order():
    response = replay("logprobs_chat_stream")
    tops = response.top_logprobs
    assert [max(top, key=top.get) for top in tops] == ["t888", "t535"]
    assert tops[0] == {"t888": 0.0, "t2641": -32.25, "t1416": -32.25}
    assert len(tops[1]) == 3


def test_a_unary_completion_gives_each_tokens_top_in_order():
    tops = replay("logprobs_completion_unary").top_logprobs
    assert [max(top, key=top.get) for top in tops] == ["t3163", "t1056", "t2501", "t3601"]
    assert tops[0] == {"t3163": 0.0, "t1460": -31.3125, "t2312": -31.5}


def test_a_response_without_them_has_none():
    assert replay("migrated_stream").top_logprobs is None


def test_each_api_asks_in_its_own_words():
    chat = Request("chat", True, "m", "p", 8, top_logprobs=5).body()
    assert (chat["logprobs"], chat["top_logprobs"]) == (True, 5)
    assert Request("completion", True, "m", "p", 8, top_logprobs=5).body()["logprobs"] == 5
    assert "logprobs" not in Request("chat", True, "m", "p", 8).body()


def counting(tokens: int | None):
    return lambda text: tokens


def test_a_response_that_carries_none_though_asked_fails():
    problems = evidence.logprob_problems(replay("migrated_stream"), 5, lambda *_: None, counting(3))
    assert problems == ["the response carries no log-probabilities; the request asked for 5"]


def test_the_judges_departure_is_the_requests_problem():
    seen: list = []

    def judge(observed, text):
        seen.append((observed, text))
        return "the log-probabilities depart from the reference at token 2: ..."

    response = replay("logprobs_chat_stream")
    assert evidence.logprob_problems(response, 3, judge, counting(2)) == [judge(None, "")]
    assert seen[0] == (response.top_logprobs, response.text)  # judged on the text received


@pytest.mark.parametrize("received", [1, 3, 24])
def test_log_probabilities_for_other_than_the_tokens_received_fail(received):
    """A frontend that drops the log-probabilities of some frames, or sends extra ones, leaves
    the tokens it did send unjudged: that is no agreement."""
    response = replay("logprobs_chat_stream")
    problems = evidence.logprob_problems(response, 3, lambda *_: None, counting(received))
    assert problems == [f"2 tokens carry log-probabilities; the client received {received}"]


def test_an_engine_that_does_not_count_tokens_leaves_the_count_to_the_judge():
    response = replay("logprobs_chat_stream")
    assert evidence.logprob_problems(response, 3, lambda *_: None, counting(None)) == []


def test_an_empty_response_asked_for_them_reads_none():
    assert Response().top_logprobs is None


#: Recorded stop requests (the frontend matches them: responses.stops): the text the client
#: read, and the stop string that ended it, held back.
STOPPED = {
    "logprobs_stop_completion_stream": (" t473 t1934 t1202 ", "t1781 t2479 t2284 t2127 t3874"),
    "logprobs_stop_chat_stream": (" t3891 t4055 t503 ", "t1253 t1084 t740 t1360 t112"),
    "logprobs_stop_chat_unary": (" t3891 t4055 t503 ", "t1253 t1084 t740 t1360 t112"),
    "logprobs_min_tokens_completion_stream": (
        " t473 t1934 t1202 t1781 t2479 t2284 t2127 t3874 t2696 t3609 t2772 t3899 ",
        "t810 t2875",
    ),
}


def stop_request(name: str) -> Request:
    shown, held = STOPPED[name]
    begins = len(shown.split())
    stop = Stop(held, begins, begins + len(held.split()), False)
    return Request("completion", True, "m", "p", 24, top_logprobs=5, stop=stop)


@pytest.mark.parametrize("name", STOPPED)
def test_a_stop_request_carries_the_log_probabilities_of_the_string_held_back(name):
    """Dynamo 1.6.1 holds the stop string's text back, not its tokens' log-probabilities: in
    frames of no text, or in the last that has some. At temperature 0 each token's best is
    itself."""
    response = replay(name)
    shown, held = STOPPED[name]
    assert (response.text, response.finish_reason) == (shown, "stop")
    tops = response.top_logprobs
    assert [max(top, key=top.get) for top in tops] == (shown + held).split()
    assert response.completion_tokens == len(tops)


@pytest.mark.parametrize("name", STOPPED)
def test_a_stop_requests_tokens_are_judged_with_the_string_held_back(name):
    judged: list = []
    owed = evidence.Owed(
        STOPPED[name][0], "the reference", logprobs=lambda *seen: judged.append(seen)
    )
    response = replay(name)
    found = evidence.content(stop_request(name), response, owed, on_cpu(), None)
    assert found.problems == []
    assert judged == [(response.top_logprobs, "".join(STOPPED[name]))]


def test_a_stop_string_held_back_without_its_log_probabilities_fails_by_the_count():
    """The chat stream's frames of no text lose their log-probabilities: of the five tokens
    held back, only the first's, in the frame of the space before the string, is left."""
    name = "logprobs_stop_chat_stream"
    frames = [json.loads(e[len("data: ") :]) for e in recorded(name)["body"].split("\n\n")[:-2]]
    for data in frames:
        for choice in data["choices"]:
            if choice["delta"].get("content") is None:
                choice.pop("logprobs")
    body = "".join(f"data: {json.dumps(d)}\n\n" for d in frames) + "data: [DONE]\n\n"
    owed = evidence.Owed(STOPPED[name][0], "the reference", logprobs=lambda *_: None)
    found = evidence.content(stop_request(name), replay(name, body), owed, on_cpu(), None)
    assert found.problems == [
        "4 tokens carry log-probabilities; the client received 3 and 5 held back in its stop string"
    ]
