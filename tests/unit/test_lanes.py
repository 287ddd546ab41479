"""A load case's lanes in report.html, drawn from a history this test writes: one lane per
request, its tokens in the colour of the worker that sent them, before and after the move."""

import re

from handoff.runs.lanes import FAILED, PALETTE, bars, lanes_svg


def chunks(request: int, times: list[float]) -> list[dict]:
    return [{"event": "chunk", "at": t, "request": request, "text": " t1"} for t in times]


HISTORY = [
    {"event": "requests_sent", "at": 1.0},
    *chunks(0, [1.1, 1.2, 1.3, 1.5]),  # cut at 1.6, moved to w1, resumed at 3.0
    *chunks(1, [1.1, 1.2, 1.3, 1.4, 1.5, 1.7, 1.8]),  # a survivor's stream
    {"event": "fault_sent", "at": 1.6, "signal": "SIGKILL", "worker": "w0"},
    {"event": "migration_seen", "at": 1.7},
    *chunks(0, [3.0, 3.1, 3.2]),
    {"event": "response_finished", "at": 1.9, "request": 1, "response": "HTTP 200"},
    {"event": "response_finished", "at": 2.0, "request": 2, "response": "HTTP 503"},
    {"event": "response_finished", "at": 3.3, "request": 0, "response": "HTTP 200"},
    {
        "event": "load_accounted",
        "at": 3.4,
        "requests": [
            {"n": 0, "worker": "w0", "workers": ["w0", "w1"], "cut": True, "stream": True,
             "state": "decoding", "failed": False, "fault_to_next_token_ms": 1400.0},
            {"n": 1, "worker": "w1", "workers": ["w1"], "cut": False, "stream": True,
             "state": "decoding", "failed": False},
            {"n": 2, "worker": "w0", "workers": ["w0"], "cut": True, "stream": False,
             "state": "queued", "failed": True},
        ],
    },
]  # fmt: skip


def lane(svg: str, n: int) -> str:
    return re.search(rf'<g class="lane" data-request="{n}">.*?</g>', svg).group(0)


def test_each_request_is_a_lane_coloured_by_the_worker_that_sent_its_tokens():
    svg = lanes_svg("load/x", HISTORY)
    assert svg.startswith('<svg class="lanes" data-case="load/x"')
    assert svg.count('<g class="lane"') == 3
    w0, w1 = PALETTE[0], PALETTE[1]  # workers in name order
    moved = lane(svg, 0)
    assert re.findall(r'<rect [^>]*fill="(#\w+)"', moved) == [w0, w1]  # before and after
    assert "w0 then w1" in moved and "1400 ms from the fault" in moved
    assert re.findall(r'<rect [^>]*fill="(#\w+)"', lane(svg, 1)) == [w1]
    assert f'fill="{FAILED}"' in lane(svg, 2)  # the unary request that failed: a red mark
    assert '<g class="fault">' in svg and "SIGKILL → w0" in svg
    assert '<g class="migration">' in svg


def test_a_case_of_one_request_has_no_lanes():
    assert lanes_svg("aggregate/x", [{"event": "request_sent", "at": 0.1}]) == ""


def test_tokens_closer_than_a_pause_are_one_bar():
    assert bars([1.0, 1.1, 1.2, 2.0, 2.1]) == [(1.0, 1.2), (2.0, 2.1)]
    assert bars([]) == []
