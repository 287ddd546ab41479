"""Token continuity, checked on a real migrated stream recorded from the mocker (one worker
SIGKILLed mid-stream), then on the same stream with one frame dropped or repeated."""

import copy
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from handoff import continuity
from handoff.client import Chunk, Response
from handoff.continuity import (
    Migration,
    Takeover,
    check,
    differing_token,
    first_divergence,
    takeover,
)
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


# --- The re-issued context: usage.prompt_tokens against what the client had read --------------

PROMPT = 32  # the recorded request's prompt, as the frontend tokenized it (usage says 40)


def content() -> list[int]:
    """Indexes into the recorded chunks of the frames that carry a token."""
    return [
        i
        for i, c in enumerate(RECORDED["chunks"])
        if c["data"]["choices"] and Chunk(0, c["data"]).text
    ]


def migration(response: Response, into_pause_s: float = 0.001) -> Migration:
    """The recorded migration: the new worker received the request just after the last frame
    the client read before the pause (the longest gap after the fault)."""
    frames = [c for c in response.chunks if c.text]
    last_old = max(range(1, len(frames)), key=lambda i: frames[i].at - frames[i - 1].at) - 1
    return Migration(
        PROMPT, RECORDED["fault_at"], Takeover("worker-1", frames[last_old].at + into_pause_s)
    )


@pytest.fixture
def short_floor(monkeypatch):
    """The recorded mocker migration paused under 36 ms, below the floor a certain boundary
    needs (continuity.MIN_PAUSE_S): the rules past the floor are exercised with it lowered."""
    monkeypatch.setattr(continuity, "MIN_PAUSE_S", 0.02)


def test_a_pause_shorter_than_a_client_stall_leaves_the_boundary_ambiguous():
    response = recorded()
    taken = migration(response)
    del response.chunks[content()[7]]  # lost, but a 28 ms pause could be a client's stall
    result = check(response, RECORDED["max_tokens"] - 1, COUNT, migration=taken)
    assert not any("the re-issued context" in p for p in result.problems)
    assert "is shorter than a stall of the client's can be (0.2 s)" in result.notes[0]


@pytest.mark.usefixtures("short_floor")
def test_the_recorded_context_is_the_prompt_plus_the_tokens_before_the_pause():
    response = recorded()
    result = check(response, RECORDED["max_tokens"], COUNT, migration=migration(response))
    assert result.problems == []
    assert result.notes[0].startswith(
        "the re-issued context is the prompt plus exactly the 8 tokens the client read before "
        "worker-1's first (the 27.5 ms pause before frame 9"
    )


def test_a_token_replayed_at_the_migration_fails_with_the_count_unchanged():
    """The frame before the pause twice, the final content frame dropped: 200 tokens still."""
    response = recorded()
    taken = migration(response)
    at = content()[7]
    response.chunks.insert(at + 1, copy.deepcopy(response.chunks[at]))
    del response.chunks[content()[-1] + 1]
    result = check(response, RECORDED["max_tokens"], COUNT, migration=taken)
    assert result.problems == [
        "the client had read 9 tokens before worker-1 received the re-issued request, but the "
        "re-issued context carried 8 (usage.prompt_tokens 40 - prompt 32): 1 replayed at the "
        "migration"
    ]


@pytest.mark.usefixtures("short_floor")
def test_a_token_lost_at_the_migration_and_one_repeated_later_fails():
    response = recorded()
    taken = migration(response)
    later = content()[11]
    response.chunks.insert(later + 1, copy.deepcopy(response.chunks[later]))
    del response.chunks[content()[7]]
    result = check(response, RECORDED["max_tokens"], COUNT, migration=taken)
    assert result.problems == [
        "the client read 7 tokens before worker-1's first (the 35.9 ms pause before frame 8, "
        "after worker-1 received the request), but the re-issued context carried 8 "
        "(usage.prompt_tokens 40 - prompt 32): 1 lost at the migration, and as many repeated "
        "after it"
    ]


@pytest.mark.usefixtures("short_floor")
def test_frames_read_back_to_back_after_the_pause_leave_the_boundary_ambiguous():
    """A client that fell behind reads queued frames together: the faulted worker's last frame
    may sit after the pause, so a loss there cannot be told; a loss passes, with a note."""
    response = recorded()
    taken = migration(response)
    first_new = content()[8]
    response.chunks[first_new + 1].at = response.chunks[first_new].at
    del response.chunks[content()[7]]  # lost, but the boundary is no longer certain
    result = check(response, RECORDED["max_tokens"] - 1, COUNT, migration=taken)
    assert not any("the re-issued context" in p for p in result.problems)
    assert (
        "is followed by frames read back to back: the client had fallen behind" in (result.notes[0])
    )


def test_a_context_that_grew_with_no_takeover_logged_fails():
    response = recorded()
    result = check(
        response,
        RECORDED["max_tokens"],
        COUNT,
        migration=Migration(PROMPT, RECORDED["fault_at"], None),
    )
    assert result.problems == [
        "usage.prompt_tokens is 40, the prompt's 32 plus 8, but no worker but the faulted one "
        "logged receiving the request"
    ]


def test_the_takeover_is_read_from_the_worker_log_on_the_monotonic_clock(tmp_path):
    wall = datetime.now(UTC)
    line = (
        f"\x1b[2m{wall.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}\x1b[0m  INFO handle_payload: "
        "dynamo_runtime::pipeline::network::ingress::push_handler: request received "
        'request_id=4c659b09-d256 otel.kind="server"\n'
    )
    (tmp_path / "w1.log").write_text("another line\n" + line)
    (tmp_path / "w2.log").write_text(line.replace("4c659b09", "00000000"))
    taken = takeover({"w1": tmp_path / "w1.log", "w2": tmp_path / "w2.log"}, "cmpl-4c659b09-d256")
    assert taken is not None and taken.worker == "w1"
    expected = time.monotonic() - (time.time() - wall.timestamp())
    assert abs(taken.received_at - expected) < 0.05
    assert takeover({"w2": tmp_path / "w2.log"}, "cmpl-4c659b09-d256") is None
