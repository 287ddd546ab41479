"""Judging one case: what the policy says must happen, against what the client and the
frontend's counters saw."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handoff.client import Response
from handoff.faults import FaultReport
from handoff.metrics import MigrationCounts
from handoff.policies import Policy


@dataclass
class Verdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)
    #: The last phase reached; on failure, where it failed.
    phase: str = ""

    def summary(self) -> str:
        head = "PASS" if self.passed else f"FAIL in {self.phase}"
        return head if not self.reasons else f"{head}: " + "; ".join(self.reasons)


def expected_counts(policy: Policy) -> dict[str, int]:
    return {
        "ongoing_request": policy.ongoing_request,
        "new_request": 0,
        "max_seq_len_exceeded": policy.max_seq_len_exceeded,
        "succeeded": policy.succeeded,
        "failed": policy.failed,
    }


def count_problems(policy: Policy, counts: MigrationCounts, mode: str) -> list[str]:
    """Counter mismatches. In lower_bound mode a counter may exceed its expectation, except
    new_request, which must stay 0 (a fault mid-request is never a new request)."""
    seen = counts.as_dict()
    problems = []
    for name, want in expected_counts(policy).items():
        got = seen[name]
        exact = mode == "exact" or name == "new_request"
        if (got != want) if exact else (got < want):
            relation = "" if exact else "at least "
            problems.append(f"migration counter {name} = {got}, expected {relation}{want}")
    return problems


def response_problems(policy: Policy, response: Response, max_tokens: int) -> list[str]:
    if policy.completes:
        return completion_problems(response, max_tokens)
    if response.exception:
        return [f"expected an API error, but the connection failed: {response.exception}"]
    if response.status != 200 or response.error is not None:
        return []
    return [
        f"policy {policy.name} requires an API error after the fault, "
        f"but the response ended without one: {response.summary()}"
    ]


def completion_problems(response: Response, max_tokens: int) -> list[str]:
    if response.exception:
        return [f"the response did not complete: {response.exception}"]
    if response.status != 200:
        return [f"expected a complete response, got HTTP {response.status}: {response.error}"]
    problems = []
    if response.error is not None:
        problems.append(f"the stream carried an error frame: {response.error}")
    if response.finish_reason != "length":
        problems.append(f"finish_reason {response.finish_reason!r}, expected 'length'")
    if response.completion_tokens != max_tokens:
        problems.append(
            f"{response.completion_tokens} completion tokens in usage, expected {max_tokens}"
        )
    return problems


def judge(
    policy: Policy,
    response: Response,
    counts: MigrationCounts,
    fault: FaultReport,
    max_tokens: int,
    mode: str,
) -> Verdict:
    problems = []
    if fault.response_done_at_kill:
        problems.append(
            f"the response had ended before {fault.signals[-1]} reached {fault.worker}: "
            f"the request was not in flight at the fault (raise the output length)"
        )
    problems += response_problems(policy, response, max_tokens)
    problems += count_problems(policy, counts, mode)
    return Verdict(passed=not problems, reasons=problems, phase="verdict")


def observed(response: Response, counts: MigrationCounts) -> dict[str, Any]:
    """What the verdict was based on, for the history."""
    return {"response": response.summary(), "counts": counts.as_dict()}
