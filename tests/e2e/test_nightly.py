"""`handoff nightly`: each installed backend runs where it can; the table says what did not."""

import os
import subprocess
import sys

ONE_CASE = "aggregate and migration_enabled-worker_failure-chat-stream-nats"


def nightly(tmp_path, *pytest_args, plugins="example,vllm", require=()):
    env = {**os.environ, "HANDOFF_PLUGINS": plugins}
    env.pop("HANDOFF_IMAGE", None)
    required = [arg for name in require for arg in ("--require", name)]
    return subprocess.run(
        [sys.executable, "-m", "handoff.cli", "nightly", "--logs", str(tmp_path), *required, "--",
         "-p", "no:cacheprovider", *pytest_args],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def row(stdout, backend):
    return next(line for line in stdout.splitlines() if line.startswith(f"│ {backend} "))


def test_runs_what_can_run_and_says_why_the_rest_did_not(tmp_path):
    """vllm cannot run here (no GPU) and is not required; the example, required, ran: the
    night is green, and says why vllm did not run."""
    result = nightly(tmp_path, "-k", ONE_CASE, require=("example",))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "required backend" not in result.stdout
    ran = row(result.stdout, "example").split("│")
    assert [c.strip() for c in ran[2:6]] == ["yes", "1", "0", "0"]
    skipped = row(result.stdout, "vllm")
    assert "│ no " in skipped and "the vllm backend cannot run here: no GPU" in result.stdout
    junit = list(tmp_path.glob("nightly-*/example-nightly.xml"))
    assert len(junit) == 1 and 'name="test_migration[aggregate/' in junit[0].read_text()


def test_a_backend_that_ran_nothing_fails_the_night(tmp_path):
    result = nightly(tmp_path, "-k", "no_such_case", plugins="example")
    assert result.returncode == 1
    assert [c.strip() for c in row(result.stdout, "example").split("│")[2:7]] == [
        "yes", "0", "0", "0", "5",
    ]  # fmt: skip


def test_a_required_backend_that_did_not_run_fails_the_night(tmp_path):
    """The example ran and passed, but vllm (no GPU here) and a backend not installed were
    required: the night is red, with one line for each."""
    result = nightly(tmp_path, "-k", ONE_CASE, require=("vllm", "sglang"))
    assert result.returncode == 1, result.stdout[-3000:]
    assert [c.strip() for c in row(result.stdout, "example").split("│")[2:7]] == [
        "yes", "1", "0", "0", "0",
    ]  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith("required backend")]
    assert len(lines) == 2, result.stdout[-3000:]
    assert lines[0].startswith("required backend 'vllm' did not run: the vllm backend cannot")
    assert "'sglang' did not run: it is not among the backends loaded here" in lines[1]
