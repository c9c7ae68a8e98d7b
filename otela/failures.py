"""Finding the cause behind trio's exception groups, so failures read as one line."""

from __future__ import annotations


def os_error_in(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc`` (a port in use, an unreadable file), which trio's
    nurseries may have wrapped in exception groups; ``None`` if there is none."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = os_error_in(inner)
            if found is not None:
                return found
    return None
