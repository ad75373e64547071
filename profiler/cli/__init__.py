"""Headless command line: `python -m profiler <command> ...`.

Commands register themselves by decorator from modules in this package (summary, analyze,
capture, ...), so adding one never edits a central if-chain. Exit status: 0 on success, 2 on bad
input with one clear line on stderr (any `FusionLensError`).
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from dataclasses import dataclass
from typing import Callable

from profiler.errors import FusionLensError

COMMANDS: dict[str, "Command"] = {}


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def register_command(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    """Decorator: register `run(args) -> exit code` as subcommand `name`; duplicates raise."""

    def wrap(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        if name in COMMANDS:
            raise ValueError(f"command {name!r} is already registered")
        COMMANDS[name] = Command(name, help, add_arguments, run)
        return run

    return wrap


def _load_commands() -> None:
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's usage errors: one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(prog: str = "python -m profiler") -> argparse.ArgumentParser:
    _load_commands()
    parser = _Parser(prog=prog, description="FusionLens profiler: trace analysis and capture")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for cmd in sorted(COMMANDS.values(), key=lambda c: c.name):
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except FusionLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, MemoryError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
