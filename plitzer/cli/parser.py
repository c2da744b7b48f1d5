"""The ``plitzer`` command line's parser, built from the table of subcommands.

One loop over :data:`plitzer.cli.table.COMMANDS` (their help, examples and options);
``plitzer NAME`` runs ``plitzer.cli.commands.cmd_NAME``. The run's parameters take their
help, types and defaults from ``planner.parameters`` (:func:`plitzer.cli.options.setting`).
A mistake is one ``plitzer: error:`` line and exit status 2 (:class:`_Parser`).
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from plitzer.cli import commands
from plitzer.cli.table import COMMANDS

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes are one ``plitzer: error:`` line (not the usage and a second line)."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("plitzer").strip()
        head = f"{where}: " if where else ""
        see = f"plitzer {where} --help" if where else "plitzer --help"
        self.exit(2, f"plitzer: error: {head}{message} (see {see})\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="plitzer",
        description="Deterministic, resumable loader for pre-tokenized Parquet: plans, audits, demo.",
    )
    from plitzer import __version__

    parser.add_argument("--version", action="version", version=f"plitzer {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="print the traceback of an error (also PLITZER_DEBUG=1), for bug reports"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for c in COMMANDS.values():
        p = sub.add_parser(
            c.name,
            help=c.help,
            description=c.description,
            epilog=c.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            add_help=c.add_help,
        )
        for option in c.options:
            option.add_to(p)
        p.set_defaults(func=getattr(commands, f"cmd_{c.name}"), **c.defaults)
    return parser
