"""A case that runs into a known upstream defect on purpose: judged by Dynamo's documented
promise, it is a strict expected failure only when it fails with every sign of that defect and
for no reason the defect does not explain. The reasons below are those real runs gave on Dynamo
1.6.1 (the mocker's drain_expired and stall_past_lease cases, single and under load, and the
decode_race case on vLLM's CPU engine, 2026-12-04);
tests/e2e/test_known_defects_hide_nothing.py makes a second failure happen beside each defect.
A Dynamo that keeps the promise cannot be run here, so its pass is shown on a verdict."""

import re
from pathlib import Path

import pytest

from handoff.policies import KNOWN_DEFECTS, KNOWN_DIVERGENCES, KNOWN_RACES, MIXED_WORKER_SET
from handoff.runs.results import CaseRecord, tally
from handoff.verdict import Verdict, against_known_defect

DRAIN = KNOWN_DEFECTS["drain_expired"]
LEASE = KNOWN_DEFECTS["stall_past_lease"]
CUT_OFF = KNOWN_DEFECTS["etcd_partition"]
RESTART = KNOWN_RACES["discovery", "etcd_restart"]
RACE = KNOWN_RACES["decode_race", "worker_stall"]
CUT_RACE = KNOWN_RACES["decode_race", "partition"]

#: The frontend's 500, as an SSE error frame and as an HTTP 500's body (with and without the
#: details it sometimes adds).
FRAME_500 = "{'message': 'Internal server error', 'type': 'internal_server_error', 'code': 500}"
BODY_500 = "{'message': 'Internal server error', 'type': 'Internal Server Error', 'code': 500}"
BODY_500_DETAILED = (
    "{'message': 'Internal server error', 'type': 'Internal Server Error', 'code': 500, "
    "'details': {'backend_status': 500}}"
)
WANTED_503 = (
    "requires the migration path's error 503 'Service temporarily unavailable' (HTTP 503, or an "
    "SSE error frame once streaming), but got"
)
#: A load case's requests, as their reasons name them (responses.load.Held.label).
STREAM_0 = (
    "request 0 (stream, id edbc6bf1-60be-4cf1-a343-93c4cb11c38b, decoding on worker-1-aggregate): "
)
UNARY_3 = (
    "request 3 (unary, id 582af623-5581-4372-8c7e-be6e7f4c8d56, decoding on worker-1-aggregate): "
)
STREAM_0_ON_4 = STREAM_0.replace("worker-1-aggregate", "worker-4-aggregate")
QUEUED_5 = (
    "request 5 (unary, id ca83d2e3-759a-4b32-b894-4072ac83e289, queued on worker-4-aggregate): "
)
EITHER_1 = (
    "request 1 (unary, id 4672101f-cdfb-4594-97b7-8a70cf1f2f07, decoding or queued on "
    "worker-1-decode): "
)

#: Each drain_expired failure seen, by case.
DRAINED = {
    "aggregate/migration_enabled-drain_expired-chat-stream-nats": [
        f"the stream carried an error frame: {FRAME_500}",
        "finish_reason None, expected 'length'",
        "None completion tokens in usage, expected 900",
        "the frontend counted no migration at all: worker-1-aggregate, which was faulted, was not "
        "serving the request",
        "migration counter ongoing_request = 0, expected 1",
        "migration counter succeeded = 0, expected 1",
    ],
    "aggregate/migration_disabled-drain_expired-completion-unary-tcp": [
        f"policy migration_disabled {WANTED_503} HTTP 500: {BODY_500}",
        "the frontend counted no migration at all: worker-0-aggregate, which was faulted, was not "
        "serving the request",
        "migration counter ongoing_request = 0, expected 1",
        "migration counter failed = 0, expected 1",
    ],
    "aggregate/max_seq_len_exceeded-drain_expired-chat-stream-nats": [
        f"policy max_seq_len_exceeded {WANTED_503} an SSE error frame: {FRAME_500}",
        "the frontend counted no migration at all: worker-0-aggregate, which was faulted, was not "
        "serving the request",
        "migration counter ongoing_request = 0, expected 1",
        "migration counter failed = 0, expected 1",
    ],
    "load/migration_enabled-drain_expired-chat-tcp": [
        f"{STREAM_0}the stream carried an error frame: {FRAME_500}",
        f"{STREAM_0}finish_reason None, expected 'length'",
        f"{STREAM_0}None completion tokens in usage, expected 900",
        f"{UNARY_3}expected a complete response, got HTTP 500: {BODY_500}",
        "the frontend counted no migration at all: worker-1-aggregate held 3 requests when faulted",
        "migration counter ongoing_request = 0, expected 3",
        "migration counter succeeded = 0, expected 3",
    ],
    "load/max_seq_len_exceeded-drain_expired-chat-tcp": [
        f"{STREAM_0_ON_4}policy max_seq_len_exceeded {WANTED_503} an SSE error frame: {FRAME_500}",
        f"{QUEUED_5}policy max_seq_len_exceeded {WANTED_503} HTTP 500: {BODY_500_DETAILED}",
        "the frontend counted no migration at all: worker-4-aggregate held 3 requests when faulted",
        "migration counter ongoing_request = 0, expected 3",
        "migration counter failed = 0, expected 3",
    ],
    "decode_load/migration_enabled-drain_expired-completion-tcp": [
        f"{EITHER_1}expected a complete response, got HTTP 500: {BODY_500_DETAILED}",
        "the frontend counted no migration at all: worker-1-decode held 3 requests when faulted",
        "migration counter ongoing_request = 0, expected 3",
        "migration counter succeeded = 0, expected 3",
    ],
}


def never_routed(
    worker: str, instances: str, unlisted: str | None = None, state: str = "it still runs"
) -> str:
    """recovery.unrejoined's reason, as the lease's cases gave it (on etcd the worker ends
    itself, with code 0, once it runs again)."""
    return (
        f"{worker}, healed after its fault, was never routed to again ({state}): timed out "
        f"waiting for "
        f"{worker} to take a request again; last seen: 154 request(s), HTTP 200, 1 content "
        f"chunk(s), finish_reason=length, completion_tokens=4; the frontend lists instances "
        f"{instances} and models ['handoff-mocker']; it lists none of {unlisted or worker}"
    )


#: Each stall_past_lease failure seen (under load: the stall that outlived the lease), by case.
UNROUTED = {
    "aggregate/migration_enabled-stall_past_lease-chat-stream-nats": [
        never_routed("worker-0-aggregate", "{'backend/generate': 1}")
    ],
    "load/migration_enabled-worker_stall-chat-nats": [
        never_routed("worker-1-aggregate", "{'backend/generate': 2}")
    ],
    "decode_load/migration_enabled-worker_stall-chat-nats": [
        never_routed("worker-2-decode", "{'backend/generate': 2, 'prefill/generate': 1}")
    ],
    # On etcd (2026-12-06).
    "discovery/stall_past_lease-chat-stream-tcp": [
        never_routed("worker-0-aggregate", "{'backend/generate': 1}", state="it ended with code 0")
    ],
}
#: The race of the re-issued request, seen (trial 2 of 17).
RACED = {
    "decode_race/worker_stall-chat-tcp": [
        "finish_reason None, expected 'length'",
        "None completion tokens in usage, expected 1536",
        "the stream ended without its closing data: [DONE] frame",
        "migration counter succeeded = 0, expected 1",
        "0 finish reasons in the response, expected 1",
        "the client received 24 tokens, expected 1536: 1512 lost",
        "the response has no usage.prompt_tokens: the re-issued context is unknown",
        "the migrated text departs from the reference at token 25 (character 137): ' t3055 t3333 "
        "t876 t1844 t696 t3763 t2446' expected, '' received",
    ],
}
#: The cut-off worker's race, seen (trial 1 of 24, 2026-12-06).
CUT_RACED = {
    "decode_race/partition-completion-nats": [
        "finish_reason None, expected 'length'",
        "None completion tokens in usage, expected 3964",
        "the stream ended without its closing data: [DONE] frame",
        "migration counter succeeded = 0, expected 1",
        "0 finish reasons in the response, expected 1",
        "the client received 13 tokens, expected 3964: 3951 lost",
        "the response has no usage.prompt_tokens: the re-issued context is unknown",
        "the migrated text departs from the reference at token 14 (character 76): ' t2875 t1940 "
        "t941 t3219 t1622 t2391 t287' expected, '' received",
    ],
}
#: A worker cut off from etcd past its lease, healed (2026-12-06).
CUT_OFF_UNROUTED = {
    "discovery/etcd_partition-chat-unary-tcp": [
        never_routed("worker-1-aggregate", "{'backend/generate': 1}", state="it ended with code 0")
    ],
}
#: The frontend's race after an etcd restart, seen (trial 1 of 8, 2026-12-06).
RESTARTED = {
    "discovery/etcd_restart-chat-stream-nats": [
        "a new request sent after etcd came back failed: the response did not complete: "
        "ConnectionError: HTTPConnectionPool(host='127.0.0.1', port=28298): Max retries "
        'exceeded with url: /v1/chat/completions (Caused by NewConnectionError("HTTPConnection('
        "host='127.0.0.1', port=28298): Failed to establish a new connection: [Errno 111] "
        'Connection refused")) (5.1 s after)',
        "frontend had ended (code 0) after etcd came back",
    ],
}
SEEN = (
    [(CUT_OFF, key, reasons) for key, reasons in CUT_OFF_UNROUTED.items()]
    + [(RESTART, key, reasons) for key, reasons in RESTARTED.items()]
    + [(DRAIN, key, reasons) for key, reasons in DRAINED.items()]
    + [(LEASE, key, reasons) for key, reasons in UNROUTED.items()]
    + [(RACE, key, reasons) for key, reasons in RACED.items()]
    + [(CUT_RACE, key, reasons) for key, reasons in CUT_RACED.items()]
)
#: Reasons like the race's that say something else went wrong: other tokens than the
#: reference's, a token too many, a second success missing, an error frame.
RACE_LOOKALIKES = {
    "other tokens": "the migrated text departs from the reference at token 25 (character 137): "
    "' t3055' expected, ' t3056' received",
    "a repeated token": "the client received 1537 tokens, expected 1536: 1 repeated",
    "two moves": "migration counter succeeded = 0, expected 2",
    "an error frame": "the stream carried an error frame: {'message': 'x', 'code': 500}",
}

#: A second failure beside a defect, each a reason another check really gives.
EXTRA = {
    "a repeated token": "the client received 901 tokens, expected 900: 1 repeated",
    "a counter off by one": "migration counter max_seq_len_exceeded = 1, expected 0",
    "a cached prompt": (
        "usage.prompt_tokens_details.cached_tokens is 16, expected 0: the prompt was served from "
        "a prefix cache, not computed for this case"
    ),
    "a protocol error": (
        "the frontend broke the protocol: an SSE frame is not a JSON object: 'data: {'"
    ),
    "a later migration": (
        "migration counter ongoing_request moved from 1 to 2 after the reading the verdict "
        "used: a later migration (a duplicate or a second fault)"
    ),
}


def judged(reasons: list[str], defect, witness: tuple[bool | None, str] | None = None) -> Verdict:
    """The verdict against `defect`, with the worker the reasons say was faulted, and its
    witness read as `witness` says (by default: seen)."""
    said = " | ".join(reasons)
    faulted = re.search(r"(worker-\d+-[a-z]+)(?:, which was faulted| held \d+ requests)", said)
    verdict = Verdict(False, list(reasons), "verdict")
    verdict.witnessed[defect.witness.key] = witness or (True, "its mechanism, read")
    return against_known_defect(verdict, defect, faulted.group(1) if faulted else None)


@pytest.mark.parametrize(("defect", "key", "reasons"), SEEN, ids=[k for _, k, _ in SEEN])
def test_every_reason_the_defect_explains_alone_is_that_defect(defect, key, reasons):
    verdict = judged(reasons, defect)
    assert not verdict.passed
    assert verdict.upstream_defect == defect.describe()
    assert verdict.reasons == reasons


@pytest.mark.parametrize(
    "defect",
    [DRAIN, LEASE, CUT_OFF, RESTART, RACE, CUT_RACE],
    ids=lambda d: f"{d.issue} {d.fault}",
)
def test_every_pattern_of_a_defect_explains_a_reason_seen(defect):
    """No pattern is there for a reason no run gave."""
    seen = [r for d, _, reasons in SEEN if d is defect for r in reasons]
    unused = [p.pattern for p in defect.explains if not any(p.fullmatch(r) for r in seen)]
    assert unused == []


@pytest.mark.parametrize(("defect", "key", "reasons"), SEEN, ids=[k for _, k, _ in SEEN])
def test_the_defects_reasons_without_its_witness_are_a_plain_failure(defect, key, reasons):
    """Every reason the defect explains, but its mechanism read from the system and not there
    (or never read): what the user saw is not enough to call it the defect."""
    for witness in [(False, "read, and not there"), None]:
        verdict = Verdict(False, list(reasons), "verdict")
        if witness:
            verdict.witnessed[defect.witness.key] = witness
        verdict = against_known_defect(verdict, defect)
        assert verdict.outcome == "failed" and verdict.upstream_defect == ""
        assert verdict.reasons[:-1] == reasons
        said = "read, and not there" if witness else "never read"
        assert verdict.reasons[-1] == (
            f"not {defect.issue}: its witness is not there ({defect.witness.what}): {said}"
        )


def test_a_witness_that_could_not_be_read_leaves_the_case_not_proven():
    reasons = DRAINED[next(iter(DRAINED))]
    verdict = judged(reasons, DRAIN, (None, "the log could not be read"))
    assert verdict.outcome == "not proven" and verdict.reasons == reasons
    assert verdict.unproven == [
        f"{DRAIN.issue}'s witness could not be read ({DRAIN.witness.what}): the log could not "
        f"be read"
    ]


def test_the_witness_is_in_the_notes_of_the_expected_failure():
    verdict = judged(UNROUTED[next(iter(UNROUTED))], LEASE, (True, "registrations: none"))
    assert verdict.notes == ["Dynamo issue 3493's witness: registrations: none"]


def test_the_defects_name_their_issues():
    assert judged(DRAINED[next(iter(DRAINED))], DRAIN).upstream_defect.startswith(
        "handoff finding: an expired drain ends its requests with a 500: "
    )
    assert judged(UNROUTED[next(iter(UNROUTED))], LEASE).upstream_defect.startswith(
        "Dynamo issue 3493: "
    )


@pytest.mark.parametrize("extra", EXTRA.values(), ids=EXTRA.keys())
@pytest.mark.parametrize(("defect", "key", "reasons"), SEEN, ids=[k for _, k, _ in SEEN])
def test_any_other_reason_beside_the_defect_is_a_plain_failure_naming_both(
    defect, key, reasons, extra
):
    verdict = judged([*reasons, extra], defect)
    assert not verdict.passed and verdict.upstream_defect == ""
    assert verdict.reasons == [
        *reasons,
        extra,
        f"not {defect.issue} alone: it does not explain: {extra}",
    ]


def test_a_healthy_workers_request_failing_like_the_drained_ones_is_a_plain_failure():
    """Under load the drained worker's requests end with the 500; a request decoding on
    another worker that ends the same way is not the defect's doing."""
    reasons = DRAINED["load/migration_enabled-drain_expired-chat-tcp"]  # worker-1 faulted
    bystander = f"{QUEUED_5}expected a complete response, got HTTP 500: {BODY_500}"
    verdict = judged([*reasons, bystander], DRAIN)
    assert verdict.upstream_defect == ""
    assert verdict.reasons[-1] == f"not {DRAIN.issue} alone: it does not explain: {bystander}"


def test_each_reason_the_defect_does_not_explain_is_listed():
    extras = [EXTRA["a repeated token"], EXTRA["a cached prompt"]]
    reasons = [extras[0], *UNROUTED[next(iter(UNROUTED))], extras[1]]
    verdict = judged(reasons, LEASE)
    assert verdict.upstream_defect == ""
    assert verdict.reasons[-1] == "not Dynamo issue 3493 alone: it does not explain: " + (
        " | ".join(extras)
    )


#: Reasons that look like one the drain explains, with another counter, value or error.
DRAIN_LOOKALIKES = [
    "migration counter max_seq_len_exceeded = 0, expected 1",  # a counter the drain leaves
    "migration counter new_request = 0, expected 1",
    "migration counter ongoing_request = 2, expected 1",
    "migration counter failed = 1, expected 0",
    "migration counter succeeded = 0, expected 0",
    "the stream carried an error frame: {'message': 'Service temporarily unavailable', 'type': "
    "'service_unavailable', 'code': 503}",
    "expected a complete response, got HTTP 404: {'message': 'Not Found', 'code': 404}",
    "finish_reason 'stop', expected 'length'",
    "899 completion tokens in usage, expected 900",
    f"the stream carried an error frame: {FRAME_500}; and more",  # anchored on the whole
    f"a note, then: the stream carried an error frame: {FRAME_500}",
    "the frontend counted no migration at all: worker-1-aggregate, which was faulted, was not "
    "serving the request; and the next",
]


@pytest.mark.parametrize("lookalike", DRAIN_LOOKALIKES)
def test_a_reason_like_the_drains_with_another_counter_or_value_is_a_plain_failure(lookalike):
    reasons = DRAINED["aggregate/migration_enabled-drain_expired-chat-stream-nats"]
    verdict = judged([*reasons, lookalike], DRAIN)
    assert verdict.upstream_defect == ""
    assert verdict.reasons[-1] == f"not {DRAIN.issue} alone: it does not explain: {lookalike}"


#: Reasons that look like the lease's, but say that something else went wrong.
LEASE_LOOKALIKES = {
    "other workers dropped too": (
        "the frontend dropped worker-1-aggregate, never faulted: the deployment lost discovery "
        "leases beyond the fault (a wall-clock step, or keep-alives starved), so "
        "worker-0-aggregate's own rejoin is not what this judged; "
        + never_routed("worker-0-aggregate", "{}", "worker-0-aggregate, worker-1-aggregate")
    ),
    "the probes failed": never_routed("worker-0-aggregate", "{'backend/generate': 1}").replace(
        "HTTP 200, 1 content chunk(s), finish_reason=length, completion_tokens=4",
        'HTTP 503, 0 content chunk(s), error={"message": "not ready"}',
    ),
    "another worker unlisted": never_routed(
        "worker-0-aggregate", "{'backend/generate': 1}", "worker-1-aggregate"
    ),
    "the worker still listed": never_routed(
        "worker-0-aggregate", "{'backend/generate': 2}"
    ).removesuffix("; it lists none of worker-0-aggregate"),
    "its requests unread": never_routed("worker-0-aggregate", "{'backend/generate': 1}").replace(
        "completion_tokens=4;", "completion_tokens=4; worker-0-aggregate's requests: no answer;"
    ),
    "the worker crashed": never_routed(
        "worker-0-aggregate", "{'backend/generate': 1}", state="it ended with code -11"
    ),
    "no instance listed at all": never_routed("worker-0-aggregate", "{}"),
}


@pytest.mark.parametrize("lookalike", LEASE_LOOKALIKES.values(), ids=LEASE_LOOKALIKES.keys())
def test_a_reason_like_the_leases_that_says_more_went_wrong_is_a_plain_failure(lookalike):
    verdict = judged([lookalike], LEASE)
    assert verdict.upstream_defect == ""
    assert verdict.reasons == [
        lookalike,
        f"not Dynamo issue 3493 alone: it does not explain: {lookalike}",
    ]


@pytest.mark.parametrize("lookalike", RACE_LOOKALIKES.values(), ids=RACE_LOOKALIKES.keys())
@pytest.mark.parametrize(
    ("race", "reasons"),
    [(RACE, *RACED.values()), (CUT_RACE, *CUT_RACED.values())],
    ids=["stall", "cut"],
)
def test_a_reason_like_the_races_that_says_more_went_wrong_is_a_plain_failure(
    race, reasons, lookalike
):
    verdict = judged([*reasons, lookalike], race)
    assert verdict.upstream_defect == ""
    assert verdict.reasons[-1] == f"not Dynamo issue 13088 alone: it does not explain: {lookalike}"


def test_a_failure_without_every_sign_of_the_defect_stays_a_failure_as_it_was():
    """A migration that happened but was miscounted is not the defect: a plain failure, with
    nothing added."""
    reasons = DRAINED["aggregate/migration_enabled-drain_expired-chat-stream-nats"]
    other = [r for r in reasons if "counted no migration" not in r]
    verdict = judged(other, DRAIN)
    assert not verdict.passed and verdict.upstream_defect == ""
    assert verdict.reasons == other


def test_a_stall_that_never_outlived_the_lease_is_a_plain_failure():
    """The fault's own proof failed (the frontend kept listing the worker): not the defect."""
    reason = "the stall did not outlive worker-1-aggregate's discovery lease: still listed 30 s"
    verdict = judged([reason], LEASE)
    assert not verdict.passed and verdict.upstream_defect == ""
    assert verdict.reasons == [reason]


def test_a_pass_fails_saying_the_fix_has_arrived():
    verdict = against_known_defect(Verdict(True, [], "verdict"), DRAIN)
    assert not verdict.passed and verdict.upstream_defect == ""
    (reason,) = verdict.reasons
    assert reason.startswith(f"passed, but {DRAIN.issue} was expected to fail it")
    assert "the fix has arrived; remove its entry from policies.KNOWN_DEFECTS" in reason


@pytest.mark.parametrize(
    "why",
    [
        "the successor's sampling state began at the move may give the reference's text (12 "
        "tokens carried): the case cannot tell it",
        "where the move fell is unknown (no usage.prompt_tokens): what a successor that went "
        "wrong there gives cannot be computed",
    ],
)
def test_not_proven_for_the_divergences_own_check_stays_not_proven_and_claims_no_fix(why):
    """The check that could show the documented divergence was not made (a sampling case whose
    move could not tell): that says nothing of a fix."""
    divergence = KNOWN_DIVERGENCES["frequency_penalty"]
    verdict = against_known_defect(Verdict(False, [], "verdict", unproven=[why]), divergence)
    assert verdict.outcome == "not proven" and verdict.reasons == []
    assert verdict.notes[-1].endswith("was expected to fail it: not shown")


def test_not_proven_for_another_check_still_says_the_fix_has_arrived():
    unmade = ["where worker-1's tokens begin is ambiguous"]
    divergence = KNOWN_DIVERGENCES["frequency_penalty"]
    verdict = against_known_defect(Verdict(False, [], "verdict", unproven=unmade), divergence)
    assert verdict.outcome == "failed" and "the fix has arrived" in verdict.reasons[0]


def test_a_case_without_a_known_defect_is_left_alone():
    verdict = Verdict(True, [], "verdict")
    assert against_known_defect(verdict, KNOWN_DEFECTS.get("worker_failure")) is verdict


def test_the_tally_counts_known_defects_apart_and_not_as_failures():
    cases = [
        CaseRecord("a", True, "verdict", 1.0),
        CaseRecord("b", False, "verdict", 1.0, upstream_defect=DRAIN.describe()),
        CaseRecord("c", False, "launch", 1.0),
    ]
    assert tally(cases) == "3 cases: 1 passed, 1 failed, 1 failed as known upstream defects"
    assert [c.verdict for c in cases] == ["PASS", "XFAIL upstream", "FAIL in launch"]
    assert [c.failed for c in cases] == [False, False, True]


@pytest.mark.parametrize("sign", RACE.signature)
def test_a_short_answer_without_each_sign_of_the_race_is_a_plain_failure(sign):
    """A stream cut short that counted its move a success, lost no token, or went on after the
    move is not the race: the reasons that carry the sign go, and what is left stays a failure."""
    reasons = [r for r in RACED["decode_race/worker_stall-chat-tcp"] if sign not in r]
    verdict = judged(reasons, RACE)
    assert verdict.upstream_defect == "" and verdict.reasons == reasons


ALL_DEFECTS = [
    MIXED_WORKER_SET,
    *KNOWN_DEFECTS.values(),
    *KNOWN_RACES.values(),
    *KNOWN_DIVERGENCES.values(),
]
KNOWN_ISSUES = Path(__file__).resolve().parents[2] / "docs" / "known-issues.md"


@pytest.mark.parametrize("defect", ALL_DEFECTS, ids=lambda d: f"{d.issue} {d.fault}")
def test_every_citation_can_flip(defect):
    """A strict expected failure cites an open upstream issue, a document of Dynamo's that
    says the behaviour is meant (a divergence), or a finding of handoff's own: an entry of
    docs/known-issues.md that reproduces it and says what to report. Never a merged fix."""
    if defect.issue.startswith("handoff finding"):
        text = KNOWN_ISSUES.read_text()
        heading = f"## {defect.issue}\n"
        assert heading in text, f"docs/known-issues.md has no entry {heading!r}"
        entry = text.split(heading, 1)[1].split("\n## ", 1)[0]
        assert "**Reproduce:** `nox -s " in entry
        assert "**The report to file upstream:**" in entry
    else:
        assert re.fullmatch(r"Dynamo (?:issue \d+|PR \d+ \(its [\w -]+ document\))", defect.issue)
        assert defect.issue not in MERGED_FIXES, f"{defect.issue} was merged: it cannot flip"


#: Upstream fixes merged before Dynamo 1.6.1 that a citation once named.
MERGED_FIXES = ("Dynamo issue 13952", "Dynamo PR 13952")
