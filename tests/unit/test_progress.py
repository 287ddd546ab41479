"""The live progress line counts what pytest reports, and draws on a terminal only."""

import io

from rich.console import Console

from handoff.runs.progress import LiveProgress


def test_counts_done_running_and_failed():
    out = io.StringIO()
    progress = LiveProgress(Console(file=out, force_terminal=True, width=120))
    progress.start(3)
    progress.started("a")
    progress.started("b")
    assert progress.render().plain.startswith("handoff: 0/3 done, 2 running, 0 failed, ")
    progress.finished("a", passed=True)
    progress.finished("b", passed=False)
    progress.finished("b", passed=False)  # teardown of a failed case: counted once
    progress.started("c")
    assert progress.render().plain.startswith("handoff: 2/3 done, 1 running, 1 failed, ")
    progress.stop()
    assert "handoff: " in out.getvalue()  # it was drawn while running
