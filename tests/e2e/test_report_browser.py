"""report.html of a real run, rendered by a real browser: the first pre-merge case of each
kind of drawing runs (two xdist workers), `handoff report` writes the page, and Debian's
headless chromium draws it (a screenshot) and parses it (its DOM holds one timeline per case,
and for a load or rolling case a lane per request). The whole selection runs elsewhere
(tests/e2e/test_qualification.py); this is about the page, which draws every topology from
the same events (tests/unit/test_report.py draws each kind of history)."""

import os
import shlex
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from handoff.cases import TOPOLOGIES, selection
from handoff_mocker import MockerBackend

#: The first pre-merge case of each kind of drawing: a timeline alone, a batch's lanes, and a
#: rolling restart's lanes (more than its batch).
CASES = [selection(t, "pre_merge")[0].key for t in ("aggregate", "load", "rolling")]
ONLY = [arg for key in CASES for arg in ("--handoff-case", key)]
WIDTH, HEIGHT = 1400, 3000


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail(
            "chromium is not on PATH: this test renders report.html in Debian's chromium; "
            "install it (sudo apt-get install chromium), or run `nox -s tests`, which does",
            pytrace=False,
        )
    return found


class Timelines(HTMLParser):
    """The cases the page draws a timeline of, and for a load case its lanes, one per
    request."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.keys: list[str] = []
        self.lanes: dict[str, int] = {}
        self.drawing: str | None = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        if tag == "svg" and found.get("class") == "timeline":
            self.keys.append(found["data-case"])
        elif tag == "svg" and found.get("class") == "lanes":
            self.drawing = found["data-case"]
            self.lanes[self.drawing] = 0
        elif tag == "g" and found.get("class") == "lane" and self.drawing:
            self.lanes[self.drawing] += 1

    def handle_endtag(self, tag):
        if tag == "svg":
            self.drawing = None


def browse(browser: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu",
         f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},{HEIGHT}", *args],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_chromium_draws_a_timeline_for_each_case_of_a_real_run(tmp_path):
    browser = chromium()  # before spending time on the run
    env = {**os.environ}
    # As a new user after `nox -s mocker_pre_merge`: the venv that has `handoff` is not on PATH.
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if d != venv_bin)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification", "-p",
         "no:cacheprovider", "--handoff-backend", "mocker", "--handoff-logs",
         str(tmp_path / "runs"), "-n", "2", "--handoff-allow-unproven", *ONLY],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()

    # The run's last line tells how to report it; run that as printed.
    hint = next(line for line in run.stdout.splitlines() if line.startswith("results: "))
    printed = hint.partition("; report: ")[2]
    assert printed.endswith(f" report {run_dir}"), hint
    report = subprocess.run(
        shlex.split(printed), capture_output=True, text=True, timeout=60, env=env
    )
    assert report.returncode == 0, report.stdout + report.stderr
    page = run_dir / "report.html"
    assert report.stdout.splitlines()[-1] == f"report: {page}"

    png = tmp_path / "report.png"
    shot = browse(browser, tmp_path, f"--screenshot={png}", page.as_uri())
    assert shot.returncode == 0 and png.exists(), shot.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (WIDTH, HEIGHT)
    assert len(data) > 20_000  # drawn, not blank: an empty page of this size is a few KB

    dom = browse(browser, tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    drawn = Timelines(dom.stdout)
    assert sorted(drawn.keys) == sorted(CASES)
    # A lane per request: a load or join case's batch; a rolling restart's, every one it sent.
    batch = MockerBackend.defaults["load_requests"]
    many = [key for key in CASES if TOPOLOGIES[key.split("/")[0]].load]
    assert sorted(drawn.lanes) == sorted(many)
    for key in many:
        rolling = TOPOLOGIES[key.split("/")[0]].workload == "rolling"
        assert drawn.lanes[key] > batch if rolling else drawn.lanes[key] == batch, drawn.lanes
