"""Judging one case: what the policy says must happen, against what the client and the
frontend's counters saw."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from handoff.client import Response, completion_problems
from handoff.errors import MISSED_WINDOW
from handoff.faults import FaultReport
from handoff.metrics import MigrationCounts
from handoff.policies import ApiError, KnownDefect, Outcome

#: The four outcomes of a case (docs/architecture.md, "Verdict outcomes").
PASSED, FAILED, KNOWN_DEFECT, NOT_PROVEN = "passed", "failed", "known upstream defect", "not proven"


def outcome_of(passed: bool, reasons: list[str], unproven: list[str], upstream_defect: str) -> str:
    """Which of the four a case is. A pass needs every check made; a failure outranks the
    rest; a check left unmade outranks a known defect (the defect's xfail says that every
    other promise held, which an unmade check cannot say). Fails closed: a verdict that says
    it passed while it lists an unmade check is not proven."""
    if passed and not unproven:
        return PASSED
    if reasons and not upstream_defect:
        return FAILED
    if unproven:
        return NOT_PROVEN
    return KNOWN_DEFECT if upstream_defect else FAILED


@dataclass
class Verdict:
    #: Every check made, and each held: never true while `unproven` lists a check.
    passed: bool
    reasons: list[str] = field(default_factory=list)
    #: The last phase reached; on failure, where it failed.
    phase: str = ""
    #: What was not checked, and why (e.g. content not compared for a random engine).
    notes: list[str] = field(default_factory=list)
    #: Failed exactly as a known upstream defect says (policies.KNOWN_DEFECTS): which.
    upstream_defect: str = ""
    #: Each check the case exists for that could not be made, with why: not proven, never a
    #: pass (a failure still outranks it).
    unproven: list[str] = field(default_factory=list)
    #: What the case read of a known defect's mechanism (`policies.Witness`), by its key: seen
    #: or not (None: the reading failed), and what was read.
    witnessed: dict[str, tuple[bool | None, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.passed = self.passed and not self.unproven

    @property
    def outcome(self) -> str:
        return outcome_of(self.passed, self.reasons, self.unproven, self.upstream_defect)

    def summary(self) -> str:
        outcome = self.outcome
        if outcome == NOT_PROVEN:
            return "NOT PROVEN: " + "; ".join(self.unproven)
        head = "PASS" if outcome == PASSED else f"FAIL in {self.phase}"
        said = self.reasons + [f"not proven besides: {u}" for u in self.unproven]
        return head if not said else f"{head}: " + "; ".join(said)


def missed_window(reasons: Sequence[str], unproven: Sequence[str]) -> bool:
    """Whether a case is not proven because its fault came too late (`faults.require_room`):
    nothing is known of the system then, its known defect included."""
    return not reasons and any(u.startswith(MISSED_WINDOW) for u in unproven)


def count_problems(expected: Outcome, counts: MigrationCounts, mode: str) -> list[str]:
    """Counter mismatches. In lower_bound mode a counter may exceed its expectation, except
    one expected to stay 0: a fault of one kind never counts as a migration of another."""
    seen = counts.as_dict()
    problems = []
    for name, want in expected.counts().items():
        got = seen[name]
        exact = mode == "exact" or want == 0
        if (got != want) if exact else (got < want):
            relation = "" if exact else "at least "
            problems.append(f"migration counter {name} = {got}, expected {relation}{want}")
    return problems


def late_count_problems(
    expected: Outcome, judged: MigrationCounts, final: MigrationCounts, mode: str
) -> list[str]:
    """Counters that moved after the reading the verdict used, read again at the last moment
    the deployment was up: a later migration is a duplicate or a second fault, which a count
    that agreed once would hide. In lower_bound mode a counter may still rise, except one
    expected to stay 0."""
    before, after = judged.as_dict(), final.as_dict()
    want = expected.counts()
    return [
        f"migration counter {name} moved from {before[name]} to {after[name]} after the "
        f"reading the verdict used: a later migration (a duplicate or a second fault)"
        for name in before
        if after[name] != before[name] and (mode == "exact" or want[name] == 0)
    ]


def response_problems(
    expected: Outcome, policy_name: str, response: Response, tokens: int, finish: str = "length"
) -> list[str]:
    """What the user got against what the policy promises: the whole response, or the
    migration path's own error (any other error, a 404 or a 500, is another failure)."""
    problems = [f"the frontend broke the protocol: {p}" for p in response.protocol_errors]
    if expected.error is None:
        return problems + completion_problems(response, tokens, finish)
    want = expected.error
    if response.exception:
        problems.append(f"expected an API error, but the connection failed: {response.exception}")
    elif response.status == 200 and response.error is None:
        problems.append(
            f"policy {policy_name} requires an API error after the fault, "
            f"but the response ended without one: {response.summary()}"
        )
    elif not carries(response, want):
        came = "an SSE error frame" if response.status == 200 else f"HTTP {response.status}"
        problems.append(
            f"policy {policy_name} requires the migration path's error {want} (HTTP "
            f"{want.code}, or an SSE error frame once streaming), but got {came}: "
            f"{response.error}"
        )
    return problems


def request_problems(
    expected: Outcome,
    policy_name: str,
    response: Response,
    max_tokens: int,
    cut: bool,
    finish: str = "length",
) -> list[str]:
    """One request against its promise: one the fault `cut` ends as `expected` says
    (`response_problems`); any other completes whatever the policy. Either way its prompt was
    computed for it (`cache_problems`)."""
    if cut:
        problems = response_problems(expected, policy_name, response, max_tokens, finish)
    else:
        problems = completion_problems(response, max_tokens, finish)
    return problems + cache_problems(response)


def carries(response: Response, error: ApiError) -> bool:
    """Whether the response ended with `error`: its code and message in the body of an HTTP
    error of that code, or in an SSE error frame after HTTP 200."""
    seen = response.error or {}
    return (
        response.status in (200, error.code)
        and seen.get("code") == error.code
        and (not error.message or seen.get("message") == error.message)
    )


def cache_problems(response: Response) -> list[str]:
    """A prompt the engine served from its prefix cache was not computed for this case (an
    earlier request left it there): where usage reports cached tokens, they must be 0."""
    details = (response.usage or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if cached:  # absent or None: the engine does not say
        return [
            f"usage.prompt_tokens_details.cached_tokens is {cached}, expected 0: the prompt "
            f"was served from a prefix cache, not computed for this case"
        ]
    return []


def transfer_problems(ttft_s: float | None, floor_s: float) -> list[str]:
    """Evidence that the KV transfer happened: the first token cannot come before it is done."""
    if ttft_s is None:
        return ["the frontend recorded no time to first token: the KV transfer is unproven"]
    if ttft_s < floor_s:
        return [
            f"time to first token {ttft_s:.3f} s is shorter than the KV transfer takes "
            f"({floor_s:.3f} s): no transfer happened"
        ]
    return []


def judge(
    expected: Outcome,
    policy_name: str,
    response: Response,
    counts: MigrationCounts,
    fault: FaultReport,
    max_tokens: int,
    mode: str,
    evidence: Sequence[str] = (),
    unproven: Sequence[str] = (),
    finish: str = "length",
) -> Verdict:
    """`evidence`: problems found by topology-specific checks (the KV transfer) to add;
    `unproven`: the checks they could not make, each with why; `max_tokens` and `finish`: how
    a whole response ends (`Request.ends`)."""
    problems = []
    # A drained worker may hand the request over at SIGTERM already (vLLM with no grace
    # period: the frontend migrates, or refuses to, at once); then the fault took effect before
    # the SIGKILL, and the frontend counted it. A response over before the last signal with no
    # migration counted is a fault that came too late, unless the drain's own timing says the
    # worker served it on past its drain (`FaultReport.blames`).
    migrated = counts.moves
    ended_whole = not completion_problems(response, max_tokens, finish)
    early = (
        not migrated and ended_whole and (fault.response_done_at_kill or fault.finished_in_grace)
    )
    sent = f"{fault.signals[-1]} reached {fault.worker}"
    when = f"in the graceful bound after {sent}" if fault.finished_in_grace else f"before {sent}"
    ended_at = response.finished_at if response.finished_at is not None else time.monotonic()
    blamed = early and fault.blames(ended_at)
    if early and not blamed:  # the harness's miss (`faults.require_room`)
        missed = (
            f"{MISSED_WINDOW}: the response had ended complete {when}, and the frontend "
            f"counted no migration"
        )
        found = [*cache_problems(response), *evidence]
        return Verdict(False, found, "verdict", unproven=[missed, *unproven])
    if blamed:
        problems.append(
            f"the response ended complete {when}, though it had more left than the drain's "
            f"wait when the drain began, or ran on past it: {fault.worker} served it on past "
            f"its drain"
        )
    problems += request_problems(expected, policy_name, response, max_tokens, True, finish)
    if expected.ongoing_request + expected.new_request and not migrated:
        problems.append(
            f"the frontend counted no migration at all: {fault.worker}, which was faulted, "
            f"was not serving the request"
        )
    problems += count_problems(expected, counts, mode)
    problems += evidence
    return Verdict(not problems, problems, "verdict", unproven=list(unproven))


def against_known_defect(
    verdict: Verdict, defect: KnownDefect | None, faulted: str | None = None
) -> Verdict:
    """A case that runs into a known upstream defect on purpose: failed with the defect's
    every sign and for no reason it does not explain, it is that defect (a strict expected
    failure; not proven if it also left a check unmade); with its signs and other reasons too,
    a plain failure that names the defect and each reason it does not explain, so that the
    defect hides no second failure; failed otherwise, a plain failure; passed, or not proven
    with no failure, it fails too, saying that the fix has arrived: no check made showed the
    defect; but not proven for a reason the defect calls its own check unmade
    (`KnownDefect.unmade`), or for a missed window, it stays not proven, which says nothing of
    a fix. `faulted`: the
    worker the case faulted, where a reason about a request names the request's worker (a load
    case's)."""
    if defect is None or missed_window(verdict.reasons, verdict.unproven):
        return verdict
    if not verdict.reasons and defect.unmade_by(verdict.unproven):
        verdict.notes = [*verdict.notes, f"{defect.issue} was expected to fail it: not shown"]
        return verdict
    if not verdict.reasons:  # passed, or not proven: the defect showed in no check made
        return Verdict(
            False,
            [
                f"passed, but {defect.issue} was expected to fail it ({defect.promise}): the "
                f"fix has arrived; remove its entry from policies.KNOWN_DEFECTS (a race: "
                f"from KNOWN_RACES)"
            ],
            verdict.phase,
            verdict.notes,
            unproven=verdict.unproven,
        )
    said = " | ".join(verdict.reasons)
    if not all(sign in said for sign in defect.signs()):
        return verdict
    unexplained = defect.unexplained(verdict.reasons, faulted)
    if unexplained:
        verdict.reasons = [
            *verdict.reasons,
            f"not {defect.issue} alone: it does not explain: " + " | ".join(unexplained),
        ]
        return verdict
    own = [u for u in verdict.unproven if any(p.fullmatch(u) for p in defect.leaves_unmade)]
    if own:  # checks the defect itself left unmade: said, and no longer outranking it
        verdict.unproven = [u for u in verdict.unproven if u not in own]
        verdict.notes = [
            *verdict.notes,
            *(f"unmade, as {defect.issue} leaves it: {u}" for u in own),
        ]
    return witnessed(verdict, defect)


def witnessed(verdict: Verdict, defect: KnownDefect) -> Verdict:
    """A failure the defect explains whole is the defect only where its mechanism was read
    from the system (`KnownDefect.witness`): read and not there, or never read, a plain
    failure that says so; a reading that failed, not proven."""
    seen, said = verdict.witnessed.get(defect.witness.key, (False, "never read"))
    if seen is not False:  # the defect, or (unread) a check unmade, which outranks it
        verdict.upstream_defect = defect.describe()
    if seen:
        verdict.notes = [*verdict.notes, f"{defect.issue}'s witness: {said}"]
    elif seen is None:
        verdict.unproven = [
            *verdict.unproven,
            f"{defect.issue}'s witness could not be read ({defect.witness.what}): {said}",
        ]
    else:
        verdict.reasons = [
            *verdict.reasons,
            f"not {defect.issue}: its witness is not there ({defect.witness.what}): {said}",
        ]
    return verdict
