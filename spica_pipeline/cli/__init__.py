"""`spica`: the command line (validate, sweep, export, import, list, calibrate). One module per command; every
failure ends with one line on stderr, never a traceback, and an exit code that tells the truth (cli/common.py)."""

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from spica_pipeline.cli import calibrate, exchange, sweep, validate
from spica_pipeline.cli import list as listing
from spica_pipeline.cli.common import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, fail, internal_error
from spica_pipeline.errors import SpicaError

DESCRIPTION = (
    "[EXPERIMENTAL] spica: a replay-backed smart sweeper for NVIDIA Dynamo deployments. "
    "Searches engine, router and planner configurations and scores each candidate in Dynamo Replay."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spica", description=DESCRIPTION)
    parser.add_argument("--debug", action="store_true", default=False,
                        help="print the traceback of an internal error (exit 3) to stderr")
    # --debug is accepted after the command too; SUPPRESS keeps the subparser from resetting it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="print the traceback of an internal error (exit 3) to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in (validate, sweep, exchange, listing, calibrate):
        command.add_parser(sub, common)
    return parser


def main(argv: Sequence[str] | None = None, *, evaluator: Any = None) -> int:
    """Run one command; returns its exit code. `evaluator` replaces the replay for `sweep`
    (tests drive the real CLI with a fault-injecting stand-in)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage / help
        return int(exc.code) if isinstance(exc.code, int) else EXIT_BAD_INPUT
    args.evaluator = evaluator
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `spica validate ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush stays quiet
        return EXIT_OK
    except SpicaError as err:
        return fail(str(err), err.exit_code)
    except Exception as err:  # a bug in any command: one line, the traceback only with --debug
        return internal_error(err, args.debug)
