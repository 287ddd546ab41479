"""The top log-probabilities the client asks for and reads back, in both APIs' shapes as Dynamo's
frontend sent them (recorded from vLLM's CPU engine), and what the evidence makes of them: a
response that carries none, though asked, fails; a judge's departure fails the request."""

import pytest
from frontend_replay import replay

from handoff.client import Request, Response
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


def test_a_response_that_carries_none_though_asked_fails():
    problems = evidence.logprob_problems(replay("migrated_stream"), 5, lambda *_: None, 3)
    assert problems == ["the response carries no log-probabilities; the request asked for 5"]


def test_the_judges_departure_is_the_requests_problem():
    seen: list = []

    def judge(observed, text):
        seen.append((observed, text))
        return "the log-probabilities depart from the reference at token 2: ..."

    response = replay("logprobs_chat_stream")
    assert evidence.logprob_problems(response, 3, judge, 2) == [judge(None, "")]
    assert seen[0] == (response.top_logprobs, response.text)  # judged on the text received


@pytest.mark.parametrize("received", [1, 3, 24])
def test_log_probabilities_for_other_than_the_tokens_received_fail(received):
    """A frontend that drops the log-probabilities of some frames, or sends extra ones, leaves
    the tokens it did send unjudged: that is no agreement."""
    response = replay("logprobs_chat_stream")
    problems = evidence.logprob_problems(response, 3, lambda *_: None, received)
    assert problems == [f"2 tokens carry log-probabilities; the client received {received}"]


def test_an_engine_that_does_not_count_tokens_leaves_the_count_to_the_judge():
    response = replay("logprobs_chat_stream")
    assert evidence.logprob_problems(response, 3, lambda *_: None, None) == []


def test_an_empty_response_asked_for_them_reads_none():
    assert Response().top_logprobs is None
