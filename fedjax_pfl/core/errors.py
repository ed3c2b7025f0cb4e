"""User-facing errors: bad input that the command line reports without a traceback.

Raise `UserError` (or a subclass) for anything the user can fix: an unknown
name, an impossible partition, a missing data file, a diverged run. The message
must say what to do. Programming errors stay ordinary exceptions.
"""


class UserError(Exception):
    """An error caused by the user's input; its message says how to fix it."""


class DataNotFoundError(UserError):
    """A dataset file is missing and may not be downloaded."""


class DivergedError(UserError):
    """Training produced a non-finite loss or non-finite parameters."""


def one_line(error: BaseException) -> str:
    """An exception in one line: a user error's message, else its type and message."""
    text = " ".join(str(error).split())
    if isinstance(error, UserError):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
