"""Number formatting shared by the figures and the pages (one place, so a chart and the table
beside it print a value the same way)."""
from __future__ import annotations

from typing import Optional

import pandas as pd


def si(x: Optional[float], unit: str = "") -> str:
    """1234567 -> '1.23 M<unit>' (decimal prefixes up to P); None/NaN -> '-'."""
    if x is None or pd.isna(x):
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".rstrip()
