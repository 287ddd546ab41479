"""Errors that reach the user as one clear line, naming the input and the fix."""


class HandoffError(Exception):
    """A problem the user can fix; its message is printed as a single line, without a traceback."""


class CaseFailure(Exception):
    """The system under test did something that fails the case; the message is the reason."""
