"""The results of a run as data: one record per case, gathered from every pytest worker and
written as results.json in the run folder, so a past run can be read and re-rendered."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from handoff.errors import HandoffError
from handoff.runner import CaseResult
from handoff.verdict import FAILED, KNOWN_DEFECT, NOT_PROVEN, PASSED, missed_window, outcome_of

#: The pytest user property that carries a case's record from an xdist worker to the controller.
PROPERTY = "handoff_result"
FILE = "results.json"
#: How many events before the end a failed case's record keeps, for the reader.
LAST_EVENTS = 6


@dataclass
class CaseRecord:
    key: str
    passed: bool
    #: Where it ended: "verdict" when it got that far, else the phase it failed in.
    phase: str
    seconds: float
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    #: The frontend's migration counters as read for the verdict (absent if never read).
    counts: dict[str, int] = field(default_factory=dict)
    folder: str = ""
    #: The events just before the end, for a failed case: what happened last.
    last_events: list[dict[str, Any]] = field(default_factory=list)
    #: Where its workers came from: "fresh", or the pool's name; and which workers it drew.
    pool: str = ""
    workers: list[str] = field(default_factory=list)
    #: The pytest node id it ran as: the key of pytest-split's durations file.
    nodeid: str = ""
    #: Failed exactly as a known upstream defect says: which (a strict expected failure).
    upstream_defect: str = ""
    #: The checks the case exists for that could not be made, each with why (not proven).
    unproven: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """passed, failed, known upstream defect or not proven (handoff.verdict)."""
        return outcome_of(self.passed, self.reasons, self.unproven, self.upstream_defect)

    @property
    def failed(self) -> bool:
        """Failed for a reason of its own, not as the known upstream defect it runs into."""
        return self.outcome == FAILED

    @property
    def verdict(self) -> str:
        return {
            PASSED: "PASS",
            KNOWN_DEFECT: "XFAIL upstream",
            NOT_PROVEN: "NOT PROVEN",
        }.get(self.outcome, f"FAIL in {self.phase}")

    @property
    def deployment(self) -> str:
        """`fresh`, or `pool NAME: the workers drawn`: one line for the reader."""
        if self.pool in ("", "fresh"):
            return self.pool
        return f"pool {self.pool}: {', '.join(self.workers)}"

    @classmethod
    def of(cls, result: CaseResult) -> CaseRecord:
        events = result.history.timeline()
        counts = next((e.data["counts"] for e in events if e.name == "metrics_read"), {})
        ready = next((e.data for e in events if e.name == "ready"), {})
        last = [
            {"event": e.name, "at": e.at, **_short(e.data)}
            for e in events
            if e.name not in ("chunk", "teardown_done", "verdict")
        ]
        return cls(
            key=result.case.key,
            passed=result.verdict.passed,
            phase=result.verdict.phase,
            seconds=round(result.seconds, 3),
            reasons=list(result.verdict.reasons),
            notes=list(result.verdict.notes),
            phases=result.history.phases(),
            counts=counts,
            folder=str(result.folder),
            last_events=[] if result.verdict.passed else last[-LAST_EVENTS:],
            pool=ready.get("pool", ""),
            workers=ready.get("workers", []),
            upstream_defect=result.verdict.upstream_defect,
            unproven=list(result.verdict.unproven),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CaseRecord:
        return cls(**json.loads(text))

    @property
    def migrations(self) -> int:
        return self.counts.get("ongoing_request", 0) + self.counts.get("new_request", 0)


def describe(event: dict[str, Any]) -> str:
    """`  1.234 s  fault_sent  worker=worker-0-aggregate signal=SIGKILL`: one event, one line."""
    data = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("event", "at"))
    return f"{event['at']:7.3f} s  {event['event']}  {data}".rstrip()


def _short(data: dict[str, Any]) -> dict[str, Any]:
    """An event's data, with long values cut so a record stays readable."""
    return {k: (v[:200] + "..." if isinstance(v, str) and len(v) > 200 else v)
            for k, v in data.items()}  # fmt: skip


@dataclass
class RunResults:
    backend: str
    selection: str
    run_dir: str
    wall_s: float
    cases: list[CaseRecord]
    #: What `handoff merge` checks shards against: handoff's version, the backend's device,
    #: every case key of the selection (before a split took a share), and the share this run
    #: took ({"splits": N, "group": G}), if any.
    handoff_version: str = ""
    #: The Dynamo release the run qualified, as installed where it ran ("" where unknown).
    dynamo: str = ""
    #: A mixed deployment's other release and which processes ran it ("" where unmixed).
    beside: str = ""
    mix: str = ""
    device: str = ""
    selection_keys: list[str] = field(default_factory=list)
    split: dict[str, int] | None = None
    #: Why the run ended before any case ran (a collection error), in one line; else "".
    error: str = ""
    #: The run was told that a case not proven does not fail it (--handoff-allow-unproven).
    allow_unproven: bool = False

    def write(self) -> Path:
        path = Path(self.run_dir) / FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        data = asdict(self)
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, run_dir: Path) -> RunResults:
        path = run_dir / FILE
        try:
            data = json.loads(path.read_text())
            data["cases"] = [CaseRecord(**c) for c in data["cases"]]
            return cls(**data)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise HandoffError(
                f"cannot read {path} ({type(exc).__name__}: {exc}): give the folder of a "
                "handoff run (it holds results.json)"
            ) from None

    @property
    def failed(self) -> list[CaseRecord]:
        return [c for c in self.cases if c.failed]

    @property
    def unproven(self) -> list[CaseRecord]:
        return [c for c in self.cases if c.outcome == NOT_PROVEN]

    @property
    def exit_status(self) -> int:
        """1 when a case failed, the run ended in error, or a case was not proven where the
        run did not allow it; else 0."""
        refused = self.unproven and not self.allow_unproven
        return 1 if self.failed or self.error or refused else 0


def tally(cases: list[CaseRecord]) -> str:
    """`N cases: P passed, F failed`, then the cases not proven and those that failed as known
    upstream defects, each where there are any."""
    outcomes = [c.outcome for c in cases]
    passed, failed = outcomes.count(PASSED), outcomes.count(FAILED)
    unproven, defects = outcomes.count(NOT_PROVEN), outcomes.count(KNOWN_DEFECT)
    missed = sum(1 for c in cases if missed_window(c.reasons, c.unproven))
    line = f"{len(cases)} cases: {passed} passed, {failed} failed"
    line += f", {unproven} not proven" if unproven else ""
    line += f" ({missed} of them a missed window)" if missed else ""
    return line + (f", {defects} failed as known upstream defects" if defects else "")
