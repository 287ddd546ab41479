"""A Ctrl-C that lands inside the standard library's locking is raised once the thread is out
of it, never in there, where it could leave a lock held and hang the run's teardown (an
interrupted run hung in urllib3's pool queue so), and never twice."""

import subprocess
import sys

from interrupted_runs import hears_ctrl_c

PRELUDE = """
import os
import signal
import sys
import threading
import time

from handoff.machine.interrupts import interruptible, raise_if_interrupted, remember, INTERRUPTS

remember()
lock = threading.Lock()
lock.acquire()
main = threading.get_ident()


def until(condition, awaited):
    deadline = time.monotonic() + 30
    while not condition():
        if time.monotonic() > deadline:
            print(f"timed out waiting for {awaited}", flush=True)
            os._exit(3)
        time.sleep(0.001)


def sigint_while_main_waits_in_condition_enter():
    enter = threading.Condition.__enter__.__code__
    until(lambda: sys._current_frames()[main].f_code is enter, "the main thread to wait there")
    os.kill(os.getpid(), signal.SIGINT)
    until(lambda: INTERRUPTS, "the handler to run")
    lock.release()


threading.Thread(target=sigint_while_main_waits_in_condition_enter, daemon=True).start()
"""

RAISED_AFTER = """
entered = False
try:
    with threading.Condition(lock):
        entered = True
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pass
except KeyboardInterrupt as exc:
    print(f"entered={entered} raised={exc} held={lock.locked()}")
"""


def run(script: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + script],
        capture_output=True, text=True, timeout=60, preexec_fn=hears_ctrl_c,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_a_sigint_inside_condition_enter_is_raised_once_out_of_it():
    """The signal interrupts the main thread's wait for the lock in `Condition.__enter__`: the
    wait goes on, the block runs and frees the lock, and the interrupt is raised after it."""
    assert run(RAISED_AFTER) == "entered=True raised=signal SIGINT held=False"


RAISED_BY_A_WAIT = """
import handoff.machine.interrupts

handoff.machine.interrupts.RETRY_S = 0.5  # the wait comes first, unless the machine stalls
raised = []
try:
    with interruptible():
        with threading.Condition(lock):
            pass
        raise_if_interrupted()
except KeyboardInterrupt as exc:
    raised.append(str(exc))
deadline = time.monotonic() + 30
try:
    while signal.getitimer(signal.ITIMER_REAL)[0] > 0 and time.monotonic() < deadline:
        pass
    for _ in range(100_000):  # the timer's handler has run by now
        pass
except KeyboardInterrupt as exc:
    raised.append(str(exc))
print(raised)
"""


def test_an_interrupt_a_wait_raised_first_is_not_raised_again_by_the_timer():
    assert run(RAISED_BY_A_WAIT) == "['signal SIGINT']"
