"""`handoff report RUN_DIR`: the case table, each failed case in words, and report.html.

The run in data/report_run was recorded from real mocker cases (its folder paths rewritten to a
relative run folder): a migration-enabled stream case against a frontend with migration off
(fails in verdict), a graceful unary case that passed, and a case whose workers were started
with a flag the mocker rejects (fails in launch, never ready).
"""

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from handoff.cli import main
from handoff.runs.report import nice_step
from handoff.runs.results import RunResults

DATA = Path(__file__).parent / "data" / "report_run"
STREAM = "aggregate/migration_enabled-worker_failure-chat-stream-tcp"
UNARY = "aggregate/migration_enabled-graceful_shutdown-completion-unary-tcp"
START_UP = "aggregate/max_seq_len_exceeded-worker_failure-completion-stream-tcp"


@pytest.fixture
def run(tmp_path) -> Path:
    """The recorded run, copied where the report may write."""
    return Path(shutil.copytree(DATA, tmp_path / "run"))


def report(run: Path, capsys) -> tuple[int, str, str]:
    code = main(["report", str(run)])
    out, err = capsys.readouterr()
    return code, out, err


class Elements(HTMLParser):
    """Every start tag with its attributes, and the page's text."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def timelines(self) -> list[str]:
        return [a["data-case"] for t, a in self.tags if t == "svg" and a.get("class") == "timeline"]


def svg_of(page: str, key: str) -> str:
    start = page.index(f'<svg class="timeline" data-case="{key}"')
    return page[start : page.index("</svg>", start)]


def test_a_failed_run_prints_each_failure_and_exits_1_every_time(run, capsys):
    for _ in range(2):  # a re-render of a failed run still says it failed
        code, out, err = report(run, capsys)
        assert (code, err) == (1, "")
    lines = out.splitlines()
    assert any(STREAM in line and "FAIL in verdict" in line for line in lines)  # the table
    assert any(UNARY in line and "PASS" in line for line in lines)
    assert f"FAIL {STREAM} in verdict" in lines
    assert f"FAIL {START_UP} in launch" in lines
    assert f"FAIL {UNARY}" not in out
    assert "  reason: migration counter succeeded = 0, expected 1" in lines
    assert any(
        line.startswith("  reason: worker-0-aggregate exited with code 2 during start-up")
        for line in lines
    )
    block = lines[lines.index(f"FAIL {STREAM} in verdict") :]
    last = block[block.index("  last events:") + 1 :]
    assert last[0].split() == [
        "0.453", "s", "fault_sent", "fault=worker_failure", "signal=SIGKILL",
        "worker=worker-0-aggregate", "pid=12541",
    ]  # fmt: skip
    assert "teardown_done  problems=[] ports=[23216, 28400, 22887]" in out
    # The logs are looked for in the run folder given, even though the run was recorded
    # somewhere else.
    assert f"  logs: {run / STREAM}" in lines
    assert f"  logs: {run / START_UP}" in lines
    assert "3 cases: 1 passed, 2 failed" in lines
    assert lines[-1] == f"report: {run / 'report.html'}"


def test_a_run_that_passed_exits_0_and_lists_no_failure(run, capsys):
    results = RunResults.load(run)
    results.cases = [c for c in results.cases if c.passed]
    results.run_dir = str(run)
    results.write()
    code, out, _ = report(run, capsys)
    assert code == 0
    assert "FAIL" not in out and "logs:" not in out
    assert "1 cases: 1 passed, 0 failed" in out


def test_a_folder_without_results_is_a_one_line_error(tmp_path, capsys):
    code, out, err = report(tmp_path, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"handoff: error: cannot read {tmp_path / 'results.json'}")
    assert "give the folder of a handoff run" in err


def test_the_page_has_a_timeline_per_case_and_each_failure(run, capsys):
    report(run, capsys)
    page = (run / "report.html").read_text()
    found = Elements(page)
    assert found.timelines() == sorted([STREAM, UNARY, START_UP])
    text = " ".join(found.text)
    for word in ("mocker", "pre_merge", str(run), "8.3 s", "3 cases: 1 passed, 2 failed"):
        assert word in text  # the header
    assert "content not compared with a baseline" in text  # the notes column
    assert "<script" not in page and "http" not in page and "url(" not in page  # self-contained
    # Each failed case: its phase, reasons, last events, logs.
    assert "failed in phase <b>verdict</b>" in page
    assert "failed in phase <b>launch</b>" in page
    assert "migration counter failed = 1, expected 0" in text
    assert "0.570 s  response_finished  failed=True" in text
    assert f"logs: <code>{run / STREAM}</code>" in page


def test_each_timeline_draws_what_its_case_went_through(run, capsys):
    report(run, capsys)
    page = (run / "report.html").read_text()
    stream = svg_of(page, STREAM)
    assert 'class="start-up"' in stream and "start-up 0.34 s" in stream
    assert 'class="tokens"' in stream and "12 content chunks received" in stream
    for name in ("request_sent", "fault_sent", "worker_gone", "migration_seen"):
        assert f'class="marker {name}"' in stream
    assert "SIGKILL → worker-0-aggregate" in stream and "response failed" in stream
    unary = svg_of(page, UNARY)
    assert 'class="arrival"' in unary and 'class="tokens"' not in unary  # arrives whole
    assert "SIGTERM → worker-0-aggregate" in unary and "response finished" in unary
    never_ready = svg_of(page, START_UP)
    assert "(never ready)" in never_ready and 'class="marker' not in never_ready


def test_the_token_line_steps_up_at_each_chunk(run, capsys):
    history = run / STREAM / "history.json"
    events = json.loads(history.read_text())
    chunks = [e for e in events if e["event"] == "chunk" and e["text"]]
    assert len(chunks) == 12
    report(run, capsys)
    path = svg_of((run / "report.html").read_text(), STREAM).split(' d="')[1].split('"')[0]
    heights = [float(step.split("H")[0]) for step in path.split("V")[1:]]
    assert heights == sorted(heights, reverse=True)  # up the page: never fewer tokens
    assert len(heights) <= 13  # at most one step per chunk (and none for chunks at one pixel)


def test_text_is_escaped(run, capsys):
    results = RunResults.load(run)
    evil = '<script>alert("x")</script> & <b>'
    failed = next(c for c in results.cases if c.key == STREAM)
    failed.reasons.append(evil)
    failed.notes.append(evil)
    failed.last_events.append({"event": "chunk", "at": 1.0, "text": evil})
    results.run_dir = str(run)
    results.write()
    history = run / STREAM / "history.json"
    events = json.loads(history.read_text())
    next(e for e in events if e["event"] == "fault_sent")["worker"] = evil
    history.write_text(json.dumps(events))
    report(run, capsys)
    page = (run / "report.html").read_text()
    assert "<script>" not in page and "<b>alert" not in page and "& <b>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;" in page
    assert "SIGKILL → &lt;script&gt;" in svg_of(page, STREAM)  # inside the SVG too
    assert evil in " ".join(Elements(page).text)  # and reads back as written


def test_a_case_without_history_still_has_its_timeline(run, capsys):
    (run / UNARY / "history.json").unlink()
    report(run, capsys)
    page = (run / "report.html").read_text()
    assert Elements(page).timelines() == sorted([STREAM, UNARY, START_UP])
    assert f"no history.json in {run / UNARY}" in svg_of(page, UNARY)


def test_time_ticks_are_round_numbers():
    assert [nice_step(r) for r in (0.07, 0.3, 0.41, 3.6, 12)] == [0.1, 0.5, 0.5, 5, 20]
