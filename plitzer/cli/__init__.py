"""The ``plitzer`` command line: synth, index, plan, explain, locate, audit, tokenize, demo, bench.

Each subcommand has ``--help`` with examples. Tables print with rich on a
terminal and as plain text otherwise (or CSV/JSON/Parquet with ``--format``).

Every mistake (a bad option, bad SQL, an unreadable path or file, a plitzer error) is
one ``plitzer: error: ...`` line on stderr and exit status 2, never a traceback;
``--debug`` (anywhere on the line) or ``PLITZER_DEBUG=1`` prints the traceback first,
for a bug report (docs/design.md, "One line for every mistake").

The package: :mod:`plitzer.cli.table` lists every subcommand's help, examples and
options (an entry each), :mod:`plitzer.cli.parser` builds the parser from it in one loop,
:mod:`plitzer.cli.commands` runs the subcommands (the run's settings passed on by
``run_settings``, by their ``planner.parameters`` names), :mod:`plitzer.cli.options` holds
what they share (the option groups, the readers, printing); :func:`main` here turns every
error into its one line.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

from planner.errors import one_line
from plitzer.cli.parser import build_parser

__all__ = ["build_parser", "main"]

_SQL_HINT = (
    "the tables are index, row_groups, lanes, reads (and pieces, sources where they apply); "
    "the window column is window_index (docs/usage.md)"
)


def _describe(e: BaseException) -> str:
    """One line for an error a command met: what it is and, where we know, the fix."""
    from planner.errors import PlitzerError

    if isinstance(e, PlitzerError):
        return one_line(e)
    if type(e).__module__.split(".")[0] in ("duckdb", "_duckdb"):
        # The first lines of DuckDB's message (the error and its candidates), without the caret lines.
        lines = [x for x in str(e).splitlines() if x.strip() and not x.startswith("LINE ") and set(x.strip()) != {"^"}]
        return f"--sql: {' '.join(' '.join(lines).split())}; {_SQL_HINT}"
    if isinstance(e, OSError):
        what = f"{e.filename}: " if e.filename else ""
        return f"{what}{e.strerror or one_line(e)}"
    if isinstance(e, (ValueError, KeyError, TypeError, LookupError)):
        return f"{type(e).__name__}: {one_line(e)}"
    return (
        f"{type(e).__name__}: {one_line(e)} (unexpected: run again with --debug or PLITZER_DEBUG=1 for the "
        "traceback, and report it)"
    )


def _debugging(argv: list[str]) -> bool:
    """``--debug`` anywhere before a ``bench`` (which passes its arguments on), or PLITZER_DEBUG set; removed."""
    end = argv.index("bench") if "bench" in argv else len(argv)
    flag = "--debug" in argv[:end]
    while "--debug" in argv[:end]:
        argv.remove("--debug")
        end -= 1
    return flag or os.environ.get("PLITZER_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = _debugging(args_list)
    parser = build_parser()
    # `bench` passes every argument through (--help included) to plitzer.bench.baseline.
    args, extra = parser.parse_known_args(args_list)
    if args.command == "bench":
        args.args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BrokenPipeError:
        # The reader went away (`plitzer plan ... | head`): nothing to report, and nothing more to
        # write; stdout goes to devnull so that the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:
        if debug:
            traceback.print_exc()
        print(f"plitzer: error: {_describe(e)}", file=sys.stderr)
        return 2
    return code
