"""The one error family users see: a one-line, human message; the CLI exits 2 on it."""


class FusionLensError(ValueError):
    """Bad input or an unusable environment, explained in one line (no traceback for users)."""
