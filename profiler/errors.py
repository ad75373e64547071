"""The one error family users see: a one-line, human message; the CLI exits 2 on it."""


class FusionLensError(ValueError):
    """Bad input or an unusable environment, explained in one line (no traceback for users)."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, at most `limit` characters ("" when it has none):
    the cause inside a one-line FusionLensError about a third-party failure."""
    return (str(exc).splitlines() or [""])[0][:limit]
