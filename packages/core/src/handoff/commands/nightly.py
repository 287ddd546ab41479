"""The nightly run: every installed backend's nightly selection where it can run, then one
table of what ran and what did not, with the reason.

Each backend runs in its own pytest process (its own JUnit file in the run folder), so one
backend's crash cannot take the others' results with it. A backend whose engine or GPU is
missing here is reported as not run, with its own one-line reason, unless it has an image
(the --image option, else HANDOFF_IMAGE, else its `image` setting): then it runs inside that
image (see handoff.commands.container). Backends that take no image (the mocker) run on the host.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from handoff.commands.container import pytest_command
from handoff.errors import HandoffError
from handoff.plugins import ONLY_ENV, configured_backend, load
from handoff.verdict import NOT_PROVEN

IMAGE_ENV = "HANDOFF_IMAGE"


@dataclass(frozen=True)
class Outcome:
    backend: str
    ran: bool
    passed: int = 0
    failed: int = 0
    seconds: float = 0.0
    exit_code: int = 0
    note: str = ""
    #: Cases not proven that the run allowed (skipped, never passed); refused, they failed.
    unproven: int = 0

    @property
    def ok(self) -> bool:
        """A backend that ran passed every case it collected, and collected some."""
        return not self.ran or (self.exit_code == 0 and self.failed == 0 and self.passed > 0)


def run_nightly(run_dir: Path, image: str | None, pytest_args: list[str]) -> list[Outcome]:
    """Run every installed backend's nightly selection that can run here."""
    loaded = load()
    outcomes = [Outcome(name, False, note=why) for name, why in sorted(loaded.broken.items())]
    for name in sorted(loaded.backends):
        backend = configured_backend(name)
        chosen = None
        if "image" in backend.uses_settings:
            chosen = image or os.environ.get(IMAGE_ENV) or backend.setting("image")
        if chosen is None:
            try:
                backend.check_environment()
            except HandoffError as exc:
                outcomes.append(Outcome(name, False, note=str(exc)))
                continue
        outcomes.append(run_backend(name, run_dir, chosen, pytest_args))
    return outcomes


def run_backend(name: str, run_dir: Path, image: str | None, pytest_args: list[str]) -> Outcome:
    junit = run_dir / f"{name}-nightly.xml"
    logs = ["--handoff-logs", str(run_dir / name)]  # its cases' folders inside the night's
    args = ["--handoff-selection", "nightly", f"--junitxml={junit}", *logs, *pytest_args]
    if image is None:
        argv = pytest_command(name, args, sys.executable)
    else:
        argv = [sys.executable, "-m", "handoff.commands.container", "--backend", name]
        argv += ["--image", image, "--", *args]
    started = time.monotonic()
    code = subprocess.run(argv, check=False).returncode
    seconds = time.monotonic() - started
    passed, failed, unproven = junit_counts(junit)
    where = f"inside {image}" if image else "on this machine"
    note = f"{where}; results in {junit}"
    return Outcome(name, True, passed, failed, seconds, code, note, unproven)


def junit_counts(path: Path) -> tuple[int, int, int]:
    """(passed, failed or errored, skipped as not proven) test cases of a JUnit file; all 0
    if there is none."""
    if not path.is_file():
        return 0, 0, 0
    cases = ET.parse(path).getroot().iter("testcase")
    passed = failed = unproven = 0
    for case in cases:
        outcome = {child.tag for child in case}
        skipped = case.find("skipped")
        if outcome & {"failure", "error"}:
            failed += 1
        elif skipped is not None:
            unproven += skipped.get("message", "").startswith(NOT_PROVEN)
        else:
            passed += 1
    return passed, failed, unproven


def required_missing(outcomes: list[Outcome], required: list[str]) -> list[str]:
    """One line for each backend of `--require` that did not run, saying why."""
    by_name = {o.backend: o for o in outcomes}
    lines = []
    for name in dict.fromkeys(required):
        outcome = by_name.get(name)
        if outcome is None:
            known = ", ".join(sorted(by_name)) or "none"
            lines.append(
                f"required backend {name!r} did not run: it is not among the backends loaded "
                f"here ({known}); install its package, check {ONLY_ENV}, or drop "
                f"--require {name}"
            )
        elif not outcome.ran:
            lines.append(f"required backend {name!r} did not run: {outcome.note}")
    return lines


def print_table(outcomes: list[Outcome]) -> None:
    table = Table(title="nightly")
    for column in ("backend", "ran", "passed", "failed", "not proven", "exit", "seconds"):
        table.add_column(column, no_wrap=True)
    table.add_column("note")
    for o in outcomes:
        counts = [str(o.passed), str(o.failed), str(o.unproven), str(o.exit_code)]
        counts.append(f"{o.seconds:.0f}")
        table.add_row(
            o.backend, "yes" if o.ran else "no", *(counts if o.ran else [""] * 5), escape(o.note)
        )
    Console(width=200).print(table)
