"""A Ctrl-C that arrives while Python runs a finalizer is printed as "Exception ignored" and
lost: the container run that met it went on to pass every case and exit 0. handoff's plugin
remembers the signal, stops before the next test and exits as interrupted."""

import subprocess
import sys

import pytest
from interrupted_runs import hears_ctrl_c

SUITE = """
import os
import signal


class CtrlCWhileFinalized:
    def __del__(self):
        os.kill(os.getpid(), SIGNAL)
        for _ in range(10_000):  # the handler runs here, inside the finalizer
            pass


def test_first():
    CtrlCWhileFinalized()


def test_second():
    pass
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupt_swallowed_by_a_finalizer_still_stops_the_run(tmp_path, sig):
    suite = tmp_path / "test_suite.py"
    suite.write_text(SUITE.replace("SIGNAL", f"signal.{sig}"))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", str(suite)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, preexec_fn=hears_ctrl_c,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert "Exception ignored" in out, out  # the interrupt was swallowed where it arrived
    assert done.returncode == pytest.ExitCode.INTERRUPTED, out
    assert f"signal {sig}, swallowed where it arrived" in out
    assert "1 passed" in out and "2 passed" not in out


WAIT = """
import os
import signal

from handoff.machine.interrupts import interruptible
from handoff.machine.polling import Deadline, poll_until


class CtrlCWhileFinalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):
            pass


def test_a_case_waiting():
    with interruptible():
        CtrlCWhileFinalized()
        poll_until(lambda: (None, "nothing yet"), Deadline(60), "what never comes")
"""


def test_a_swallowed_interrupt_stops_a_case_at_its_next_wait(tmp_path):
    """Inside a case (`interruptible`), the wait after the swallowed Ctrl-C raises it again, so
    the case unwinds to its teardown at once instead of running on to its end."""
    suite = tmp_path / "test_wait.py"
    suite.write_text(WAIT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", str(suite)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, preexec_fn=hears_ctrl_c,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert "Exception ignored" in out, out
    assert "KeyboardInterrupt: signal SIGINT, swallowed where it arrived" in out, out
    assert "timed out waiting" not in out and done.returncode == pytest.ExitCode.INTERRUPTED
