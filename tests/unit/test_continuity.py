"""Token continuity, checked on a real migrated stream recorded from the mocker (one worker
SIGKILLed mid-stream), then on the same stream with one frame dropped or repeated."""

import copy
import json
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

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


def later(response: Response, frame: int, by_s: float) -> Response:
    """`response` with content frame `frame` (from 0) and every frame after it read `by_s`
    later: a longer pause before it."""
    at = content()[frame]
    for chunk in response.chunks[at:]:
        chunk.at += by_s
    return response


def slower(response: Response, factor: float) -> Response:
    """The same stream read on a machine `factor` times slower: every gap longer by it."""
    start = response.chunks[0].at
    for chunk in response.chunks:
        chunk.at = start + (chunk.at - start) * factor
    return response


#: The new worker received the request 1 ms before the client read the faulted worker's last
#: frame (late on its way): causality alone no longer says that frame was the faulted worker's.
LATE = -0.001


def test_every_token_of_the_context_read_before_the_takeover_is_certain_by_causality():
    """The client had read all 8 tokens the context carried before the new worker received
    the request: none can be the new worker's, so none was lost, whatever the pause."""
    response = recorded()
    result = check(response, RECORDED["max_tokens"], COUNT, migration=migration(response))
    assert result.problems == result.unproven == []
    assert result.notes[0] == (
        "the re-issued context is the prompt plus exactly the 8 tokens the client read before "
        "worker-1 received the re-issued request (causality)"
    )


def test_a_first_token_floor_extends_what_causality_proves():
    """Every request of the case waits for a simulated KV transfer: no token of the new worker
    can come sooner than that after the fault, though it received the request before the
    client read the faulted worker's last frame."""
    response = recorded()
    floor = response.chunks[content()[7]].at + 0.001 - RECORDED["fault_at"]
    taken = replace(migration(response, LATE), first_token_floor_s=floor)
    result = check(response, RECORDED["max_tokens"], COUNT, migration=taken)
    assert result.problems == result.unproven == []
    assert result.notes[0].startswith(
        "the re-issued context is the prompt plus exactly the 8 tokens the client read before "
        "worker-1 could send its first token (the re-issued request's KV transfer takes at "
        "least 0.0"
    )
    assert result.notes[0].endswith("s after the fault) (causality)")


def test_a_pause_that_does_not_stand_out_from_the_streams_stalls_leaves_the_check_unproven():
    """The recorded mocker migration paused 27.5 ms, under twice the 13.8 ms stall the same
    stream shows later: where the new worker's tokens begin is ambiguous, and whether a token
    was lost there is not proven (never a pass), with what causality proves still checked."""
    response = recorded()
    result = check(response, RECORDED["max_tokens"], COUNT, migration=migration(response, LATE))
    assert result.problems == []
    (unmade,) = result.unproven
    assert unmade.startswith("whether a token was lost at the migration: where worker-1's")
    assert (
        "the 27.5 ms pause before frame 9 is not 2x the longest other gap of the client's "
        "reading (13.8 ms, before frame 107)"
    ) in unmade
    assert "checked only that the context holds the 7 tokens the client read before" in unmade


def test_a_text_equal_to_what_it_owes_settles_a_boundary_timing_cannot():
    """With a reference (or a deterministic baseline), a text equal to it token for token has
    lost and repeated nothing at the migration: the ambiguous boundary is a note, not a check
    unmade; a text that departs from it fails, naming where."""
    response = recorded()
    owed = response.text
    moved = migration(response, LATE)
    result = check(response, RECORDED["max_tokens"], COUNT, baseline=owed, migration=moved)
    assert result.problems == result.unproven == []
    assert any(
        n.endswith("settled by the text: it equals the undisturbed baseline token for token")
        for n in result.notes
    )
    departed = owed.replace(" ", "  ", 1)
    result = check(response, RECORDED["max_tokens"], COUNT, baseline=departed, migration=moved)
    assert result.problems and result.problems[0].startswith("the migrated text departs from")


def test_the_recorded_context_is_the_prompt_plus_the_tokens_before_the_pause():
    response = later(recorded(), 8, 0.010)  # a 37.5 ms pause: 2.7x the longest other gap
    result = check(response, RECORDED["max_tokens"], COUNT, migration=migration(response, LATE))
    assert result.problems == result.unproven == []
    assert result.notes[0].startswith(
        "the re-issued context is the prompt plus exactly the 8 tokens the client read before "
        "worker-1's first (the 37.5 ms pause before frame 9"
    )


def test_the_pause_is_judged_by_the_stalls_of_its_own_run_on_a_slower_machine():
    """Every gap three times longer: the same stream is as certain (no fixed floor that a
    slower machine's pauses would pass or miss)."""
    response = slower(later(recorded(), 8, 0.010), 3.0)
    result = check(response, RECORDED["max_tokens"], COUNT, migration=migration(response, LATE))
    assert result.problems == result.unproven == []
    assert "the 112.5 ms pause before frame 9" in result.notes[0]


def test_a_stall_elsewhere_half_as_long_as_the_pause_makes_it_ambiguous():
    response = later(later(recorded(), 8, 0.010), 150, 0.015)  # a 20.5 ms stall at frame 151
    result = check(response, RECORDED["max_tokens"], COUNT, migration=migration(response, LATE))
    assert result.problems == []
    assert (
        "(20.5 ms, before frame 151): a stall this run shows could pass for it"
        in (result.unproven[0])
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


def test_a_token_lost_at_the_migration_and_one_repeated_later_fails():
    """The lost frame lengthens the pause to 35.9 ms, which stands out: certain, and failed."""
    response = recorded()
    taken = migration(response)
    later_frame = content()[20]  # past the frames looked at for a burst
    response.chunks.insert(later_frame + 1, copy.deepcopy(response.chunks[later_frame]))
    del response.chunks[content()[7]]
    result = check(response, RECORDED["max_tokens"], COUNT, migration=taken)
    assert result.problems == [
        "the client read 7 tokens before worker-1's first (the 35.9 ms pause before frame 8, "
        "after worker-1 received the request), but the re-issued context carried 8 "
        "(usage.prompt_tokens 40 - prompt 32): 1 lost at the migration, and as many repeated "
        "after it"
    ]
    assert result.unproven == []


def test_frames_read_back_to_back_after_the_pause_leave_the_loss_unproven():
    """A client that fell behind reads queued frames together: the faulted worker's last frame
    may sit after the pause, so a loss there cannot be told: not proven, never passed."""
    response = recorded()
    taken = migration(response)
    first_new = content()[8]
    response.chunks[first_new + 1].at = response.chunks[first_new].at
    del response.chunks[content()[7]]  # lost, but the boundary is no longer certain
    result = check(response, RECORDED["max_tokens"] - 1, COUNT, migration=taken)
    assert not any("the re-issued context" in p for p in result.problems)
    assert (
        "is followed by frames read back to back: the client had fallen behind"
        in (result.unproven[0])
    )


def test_a_queue_read_back_to_back_after_one_more_stall_leaves_the_loss_unproven():
    """Seen under load: the client read the first queued frame after the pause, stalled once
    more, then read the rest together; a first gap like the engine's step proves nothing."""
    response = recorded()
    taken = migration(response)
    first_new = content()[8]
    for queued in (1, 2):  # read with the third, after one more stall
        response.chunks[first_new + queued].at = response.chunks[first_new + 3].at
    del response.chunks[content()[7]]
    result = check(response, RECORDED["max_tokens"] - 1, COUNT, migration=taken)
    assert not any("the re-issued context" in p for p in result.problems)
    assert "is followed by frames read back to back" in result.unproven[0]


# --- The new worker's own record of the context it received (the mocker's KV blocks) -------

IDS = MockerBackend().output_token_ids


def client_ids(response: Response) -> list[int]:
    return [i for c in response.chunks if c.text for i in IDS(c.text)]


def with_record(response: Response, record: list[int]) -> Migration:
    """The recorded migration, with `record` as the new worker's own record of its context."""
    return replace(migration(response), received=record)


#: What the mocker's KV blocks hold after the carried tokens: its own ids of what it generated.
GENERATED = [2913166250, 760605284, 2791099866]


def test_a_context_the_new_worker_holds_token_for_token_is_certain_whatever_the_pause():
    """The recorded 27.5 ms pause is ambiguous by timing; the record settles it."""
    response = recorded()
    taken = with_record(response, client_ids(response)[:8] + GENERATED)
    result = check(response, RECORDED["max_tokens"], COUNT, migration=taken, ids=IDS)
    assert result.problems == result.unproven == []
    assert result.notes[0] == (
        "the re-issued context is the prompt plus exactly the 8 tokens the client read first, "
        "token for token (worker-1's own record of the context it received)"
    )


def test_a_token_lost_at_the_migration_fails_by_the_record_however_short_the_pause():
    response = recorded()
    record = client_ids(response)[:8] + GENERATED
    later_frame = content()[11]
    response.chunks.insert(later_frame + 1, copy.deepcopy(response.chunks[later_frame]))
    del response.chunks[content()[7]]
    read = client_ids(response)
    result = check(
        response, RECORDED["max_tokens"], COUNT, migration=with_record(response, record), ids=IDS
    )
    assert result.problems == [
        f"the client's token 8 is token id {read[7]}, but the re-issued context's token 8 is "
        f"token id {record[7]} (worker-1's own record of the context it received): 1 lost at "
        f"the migration, and as many repeated after it"
    ]


def test_a_token_replaced_before_the_migration_fails_by_the_record():
    response = recorded()
    record = client_ids(response)[:8] + GENERATED
    frame = response.chunks[content()[3]]
    frame.data["choices"][0]["text"] = " t1"
    result = check(
        response, RECORDED["max_tokens"], COUNT, migration=with_record(response, record), ids=IDS
    )
    assert result.problems == [
        f"the client's token 4 is token id 1, but the re-issued context's token 4 is token id "
        f"{record[3]} (worker-1's own record of the context it received): a token replaced at "
        f"the migration"
    ]


def late_takeover(response: Response) -> Takeover:
    return migration(response, LATE).takeover


def test_a_record_shorter_than_the_context_leaves_it_to_timing():
    response = recorded()
    result = check(
        response,
        RECORDED["max_tokens"],
        COUNT,
        migration=replace(
            with_record(response, client_ids(response)[:5]), takeover=late_takeover(response)
        ),
        ids=IDS,
    )
    assert "pause before frame 9 is not 2x" in result.unproven[0]


# --- No takeover logged ------------------------------------------------------------------------


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


def unclaimed(response: Response, moved: bool, fault_at: float) -> Migration:
    """No worker logged receiving the request; usage says the context carried nothing."""
    return Migration(40, fault_at, None, moved)


def test_a_move_counted_that_restarted_from_the_bare_prompt_fails():
    """The client had tokens when the fault was sent, the frontend counted a move, and the
    context carried none: the new worker started from the prompt."""
    response = recorded()
    result = check(
        response,
        RECORDED["max_tokens"],
        COUNT,
        migration=unclaimed(response, True, RECORDED["fault_at"]),
    )
    assert result.problems == [
        "the client had read 7 tokens when the fault was sent and the frontend counted a move, "
        "but the re-issued context carried none (usage.prompt_tokens 40 = the prompt): the "
        "request restarted from the bare prompt, its 7 tokens lost from the context"
    ]


def test_a_move_counted_with_no_successor_found_and_nothing_read_is_not_proven():
    response = recorded()
    before_all = response.chunks[0].at - 1.0
    result = check(
        response, RECORDED["max_tokens"], COUNT, migration=unclaimed(response, True, before_all)
    )
    assert result.problems == []
    assert result.unproven == [
        "the re-issued context: the frontend counted a move, but no worker of the faulted "
        "role but the faulted one logged receiving the request (the successor's log line was "
        "not found), so where its tokens begin is unknown"
    ]


def test_no_move_counted_and_no_takeover_is_a_note():
    response = recorded()
    result = check(
        response,
        RECORDED["max_tokens"],
        COUNT,
        migration=unclaimed(response, False, RECORDED["fault_at"]),
    )
    assert result.problems == result.unproven == []
    assert "no migration counted: the request's context was never re-issued" in result.notes


def whole(response: Response) -> Response:
    """The recorded response as a unary one reads it: one frame, the whole text."""
    last = response.chunks[-1]
    data = copy.deepcopy(last.data)
    data["choices"] = [{"index": 0, "text": response.text, "finish_reason": "length"}]
    return Response(status=response.status, chunks=[Chunk(last.at, data)], done=True)


@pytest.mark.parametrize("received", [8, 9, 20])
def test_a_unary_context_carrying_fewer_tokens_than_the_frontend_had_fails(received):
    """A unary response is read whole, so nothing the client read dates a token; but the
    frontend's own count before the fault (the in-flight proof) is a floor of what the context
    it re-issues carries (8 tokens here): fewer, and the difference was lost at the move."""
    response = whole(recorded())
    moved = replace(migration(recorded()), carried_at_least=received)
    result = check(response, RECORDED["max_tokens"], COUNT, migration=moved)
    lost = [p for p in result.problems if "lost at the migration" in p]
    if received <= 8:
        assert lost == []
    else:
        assert lost == [
            f"the frontend had received {received} tokens from the faulted worker before the "
            f"fault, but the re-issued context carried 8 (usage.prompt_tokens 40 - prompt 32): "
            f"{received - 8} lost at the migration"
        ]


def test_a_unary_response_never_moved_keeps_the_bare_prompt_whatever_the_frontend_had():
    """A fault that moves nothing (the broker's) leaves the context the prompt: the count of
    tokens before the fault says nothing of it."""
    response = whole(recorded())
    response.chunks[0].data["usage"]["prompt_tokens"] = PROMPT
    unmoved = replace(migration(recorded()), moved=False, carried_at_least=29)
    result = check(response, RECORDED["max_tokens"], COUNT, migration=unmoved)
    assert not [p for p in result.problems if "lost at the migration" in p]
