"""Errors that profkit turns into one-line messages on the command line."""


class ProfkitError(Exception):
    """A problem the user can fix: the message says what is wrong and what to do."""


class TraceError(ProfkitError):
    """The input file is not a usable Nsight Systems SQLite export."""


class NoGpuActivityError(TraceError):
    """The export holds no kernel, memcpy or memset activity."""
