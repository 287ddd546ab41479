"""A Ctrl-C that lands inside the standard library's locking is raised once the thread is out
of it, never in there, where it could leave a lock held and hang the run's teardown (an
interrupted run hung in urllib3's pool queue so), and never twice. A thread still there after
`DEFER_S` is blocked in a wait: raised there. One still waiting when a case's block ends is
raised at its end."""

import subprocess
import sys

from interrupted_runs import hears_ctrl_c

#: The main thread waits in `Condition.__enter__` for a lock a helper holds; the helper sends
#: SIGINT, and releases the lock HOLD_S after the handler ran (never where None).
PRELUDE = """
import os
import signal
import sys
import threading
import time

import handoff.machine.interrupts as interrupts
from handoff.machine.interrupts import INTERRUPTS, interruptible, raise_if_interrupted

interrupts.remember()
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
    if HOLD_S is not None:
        held_until = time.monotonic() + HOLD_S
        until(lambda: time.monotonic() > held_until, "the hold to end")
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


def run(script: str, hold_s: float | None = 0.0, **settings: float) -> str:
    tuned = "".join(f"interrupts.{name} = {value}\n" for name, value in settings.items())
    done = subprocess.run(
        [sys.executable, "-c", f"HOLD_S = {hold_s}\n" + PRELUDE + tuned + script],
        capture_output=True, text=True, timeout=60, preexec_fn=hears_ctrl_c,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_a_sigint_inside_condition_enter_is_raised_once_out_of_it():
    """The signal interrupts the main thread's wait for the lock in `Condition.__enter__`: the
    wait goes on, the block runs and frees the lock, and the interrupt is raised after it."""
    assert run(RAISED_AFTER) == "entered=True raised=signal SIGINT held=False"


def test_a_retry_that_finds_the_thread_still_there_waits_again():
    """The lock is held a hundred retries long: every retry finds the main thread still in
    `Condition.__enter__`, and none raises there."""
    assert run(RAISED_AFTER, hold_s=0.3, RETRY_S=0.003) == (
        "entered=True raised=signal SIGINT held=False"
    )


def test_a_thread_still_waiting_after_the_bound_is_interrupted_in_its_wait():
    """The lock is never released: after `DEFER_S` the interrupt is raised in the wait for it,
    which holds nothing."""
    assert run(RAISED_AFTER, hold_s=None, DEFER_S=0.2) == (
        "entered=False raised=signal SIGINT held=True"
    )


RAISED_BY_A_WAIT = """
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
    """The wait comes first, unless the machine stalls half a second."""
    assert run(RAISED_BY_A_WAIT, RETRY_S=0.5) == "['signal SIGINT']"


RAISED_AT_THE_END = """
try:
    with interruptible():
        with threading.Condition(lock):
            pass
    print("the block ended, nothing raised")
except KeyboardInterrupt as exc:
    print(f"raised={exc} at the block's end")
"""


def test_an_interrupt_still_waiting_when_the_case_ends_is_raised_at_its_end():
    """Its retry would come long after: the case's block raises it as it ends, so that the
    case's teardown, outside it, does not meet it halfway."""
    assert run(RAISED_AT_THE_END, RETRY_S=30) == "raised=signal SIGINT at the block's end"


RAISED_ONCE_WHILE_UNWINDING = """
raised = []
try:
    with interruptible():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100_000):  # the handler raises here
                pass
        finally:
            raise_if_interrupted()  # a wait in a `finally` the interrupt runs on its way up
except KeyboardInterrupt as exc:
    raised.append(str(exc))
print(raised)
"""


def test_a_wait_in_a_finally_the_interrupt_unwinds_through_does_not_raise_it_again():
    """Raised again there, it would cut that `finally` short (a joiner's retirement, say)."""
    assert run(RAISED_ONCE_WHILE_UNWINDING) == "['signal SIGINT']"
