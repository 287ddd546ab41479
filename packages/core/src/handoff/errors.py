"""Errors that reach the user as one clear line, naming the input and the fix."""


class HandoffError(Exception):
    """A problem the user can fix; its message is printed as a single line, without a traceback."""


class CaseFailure(Exception):
    """The system under test did something that fails the case; the message is the reason."""


#: How the reason of a case not proven for a late fault begins: benchmarks/flake.py counts by it.
MISSED_WINDOW = "missed window"


class MissedWindow(Exception):
    """The harness's fault came after the request it aimed at had ended, or a premise of the
    case was not met: nothing is known of the system's promise, so the case is not proven
    (`faults.require_room`), never failed; the message says what was late, and by how much."""


class MissedAfterFault(MissedWindow):
    """A missed window found once the fault was made (a premise unmet, every request already
    over): the deployment is no longer as it was, and no later trial may run on it."""


class ConnectionCut(CaseFailure):
    """The client's connection to the frontend broke before any fault reached its request: the
    frontend's own state then (exited, stopped, running) is the cause to read, and the case's
    reason names it (`runner.unanswered`)."""
