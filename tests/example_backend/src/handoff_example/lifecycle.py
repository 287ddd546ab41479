"""The example plugin's own fault lifecycle, in one file: a hung worker killed by its liveness
probe. The holder is stopped (SIGSTOP) with its request in flight, then, still stopped,
SIGKILLed, as an orchestrator kills a worker that stopped answering. Composed of handoff's own
primitives; the request moves as after a kill, and the exercise judges it with every check."""

from dataclasses import replace

from handoff import faults
from handoff.errors import CaseFailure
from handoff.lifecycle import Lifecycle, hookimpl
from handoff.responses import recovery

NAME = "hang_then_kill"


def hang_then_kill(run, holder, watched, _aimed) -> faults.FaultReport:
    """Stop the holder in its window (`faults.stall`), then kill its tree while it is stopped."""
    stalled = faults.stall(NAME, holder, watched, run.deadline)
    holder.process.kill()
    if left := holder.process.wait_gone(run.deadline.within(faults.HOLDER_TIMEOUT_S)):
        raise CaseFailure(f"{holder.name} still alive after SIGSTOP and SIGKILL: {left}")
    return replace(stalled, signals=("SIGSTOP", "SIGKILL"))


#: What it leaves: the worker gone and replaced (`recovery.gone`); then, as after every fault,
#: every gauge must read 0 (the exercise checks that).
HANG_THEN_KILL = Lifecycle(NAME, "SIGSTOP", hang_then_kill, left=recovery.gone)


@hookimpl
def register_lifecycles(register):
    register(HANG_THEN_KILL)
