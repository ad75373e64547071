"""argparse types and arguments shared by the commands (a leading underscore: not a command)."""
from __future__ import annotations

import argparse
import math

DEFAULT_MAX_DECOMPRESSED_GB = 4.0


def count(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def gigabytes(text: str) -> float:
    """argparse type: a finite number of GiB > 0 (nan, inf and negatives used to reach the loader
    and fail there with a traceback)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of GiB > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of GiB > 0, got {text}")
    return value


def add_max_decompressed(p: argparse.ArgumentParser) -> None:
    """`--max-decompressed-gb` (bytes of JSON a load may decompress or read, all files together)."""
    p.add_argument("--max-decompressed-gb", type=gigabytes, default=DEFAULT_MAX_DECOMPRESSED_GB,
                   help=f"refuse traces that decompress to more than this (default {DEFAULT_MAX_DECOMPRESSED_GB:g})")


def max_decompressed_bytes(args: argparse.Namespace) -> int:
    return max(1, int(args.max_decompressed_gb * (1 << 30)))
