"""The ``costaware`` command line.

Every error is one readable line that says what to fix; ``--debug`` shows the traceback.
"

Each command lives in its own module (``costaware.cli.predict``, ``.max_batch_size``,
``.devices``, ``.compare``, ``.collect``, ``.fit``, ``.calibrate``, ``.report``), which adds its
sub-parser and runs it; this module builds the parser and turns errors into one line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from costaware.cli import calibrate, collect, devices, fit, max_batch_size, predict, report
from costaware.cli._common import CliError as CliError
from costaware.cli._common import _build_spec, _extra_of, _Parser, _spec_arguments

__all__ = ["main"]

_EPILOG = (
    "Run 'costaware COMMAND --help' for a command's options. Exit status: 0 when the "
    "command answered (predict answers for a configuration that does not fit too, and "
    "says so); 1 when max-batch-size or compare find nothing that fits; 2 on a usage "
    "error, bad input or any other error (--debug shows its traceback)."
)


def _cmd_compare(args: argparse.Namespace) -> int:
    from costaware.cli.compare import run_cli

    return run_cli(args, _build_spec(args))


def _version() -> str:
    """``costaware X``, with the torch it runs on and the shipped model's feature version."""
    import torch

    from costaware import __version__
    from costaware.core.features import FEATURE_VERSION

    return f"costaware {__version__} (torch {torch.__version__}, feature version {FEATURE_VERSION})"


class _VersionAction(argparse.Action):
    """``--version``: prints :func:`_version` and exits. The version is read when the flag
    is given, not when the parser is built: it imports torch, which every other use of the
    parser (``--help``, ``devices``) does without."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(_version())
        parser.exit()


#: commands whose options take long to build (their module imports torch): built only when
#: they are the command run, else listed with their help line alone
_HEAVY = {"collect": collect, "calibrate": calibrate}


def _command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs: its first word that is not an option (the options before
    a command, ``--debug``, ``--version`` and ``--help``, take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``costaware`` parser, every command's options built where ``command`` is None;
    else the options of :data:`_HEAVY`'s commands other than ``command`` are left out."""
    p = _Parser(
        prog="costaware",
        description=(
            "Predict a training configuration's peak GPU memory and epoch time before it runs, "
            "from a dry run on fake tensors (no GPU needed)."
        ),
        epilog=_EPILOG,
    )
    p.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    p.add_argument(
        "--version",
        action=_VersionAction,
        help="show costaware's version, torch's and the model's feature version, and exit",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    pr = predict.add_parser(sub)
    max_batch_size.add_parser(sub)
    dv = devices.add_parser(sub)

    cm = sub.add_parser(
        "compare",
        help="one configuration on every catalog GPU: fits, largest batch, time, cost",
        description=(
            "Predict MODEL's training step on each GPU of the catalog (or --devices) and print, "
            "per GPU: whether the step fits at --batch-size, the largest batch size that fits, "
            "the iteration and epoch time with their upper bounds, and the cost of an epoch at "
            "--price or a default list price. Two dry runs in all; nothing runs on a GPU. "
            "Example: costaware compare examples/models.py:resnet18 --batch-size 64 --input "
            "3x224x224 --precision bf16 --dataset-size 50000 --devices A10G,L4,L40S,H100 "
            "--price A10G=1.01,L4=0.8"
        ),
    )
    _spec_arguments(cm, batch_help="samples per step", batch_required=True)
    from costaware.cli.compare import add_arguments as _compare_arguments

    _compare_arguments(cm)
    cm.set_defaults(func=_cmd_compare)

    def heavy(name: str) -> _Parser:
        module = _HEAVY[name]
        if command is None or command == name:
            return module.add_parser(sub)  # type: ignore[no-any-return]
        return sub.add_parser(name, help=module.HELP)

    co = heavy("collect")
    fi = fit.add_parser(sub)
    ca_ = heavy("calibrate")
    rp = report.add_parser(sub)

    for sp in (pr, dv, cm, co, fi, ca_, rp):  # --debug after the command works too
        sp.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``costaware`` command.

    Every error is one line on stderr (``costaware: error: ...``, saying what to fix) and
    exit status 2; ``--debug`` (before or after the command) raises it with its traceback
    instead. Warnings are one line each too.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser(_command(argv) or "")  # no command: the help lists each command's line
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed as one line
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    import warnings

    shown = warnings.showwarning
    if not args.debug:
        warnings.showwarning = _one_line_warning
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("costaware: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (costaware report ... | head)
        with contextlib.suppress(Exception):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - no flush error at exit
        return 1
    except Exception as e:
        if args.debug:
            raise
        print(_in_flags(_error_line(e), args.command), file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = shown


def _first(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


#: how the library's messages spell a fix, and the command line's flag for it: a user of
#: the CLI is told the flag to change (per command where the flag is one command's own)
#: the commands whose flags describe a TrainingSpec
_SPEC_COMMANDS = ("predict", "max-batch-size", "compare")
#: TrainingSpec fields the spec commands take as flags of the same name
_SPEC_FLAGS = (
    "batch_size", "world_size", "grad_accumulation", "dataset_size", "epochs", "max_steps",
    "max_time", "classes", "seq_len",
)  # fmt: skip
_FLAGS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (r"ImageBatch\(\.\.\., classes=(\d+)\)", r"--classes \1", ()),
    (r"TokenBatch\(seq_len=(\d+), \.\.\.\)", r"--seq-len \1", ()),
    (r"\bprice_per_hour\b", "--price-per-hour", ("report",)),
    (r"\bprice_per_hour\b", "--price", ("compare",)),
    (r"\bmax_cost\b", "--max-cost", ("report",)),
    *((rf"(?<![-\w]){name}=", f"--{name.replace('_', '-')} ", _SPEC_COMMANDS) for name in _SPEC_FLAGS),
    # a bare name where it cannot be a word of the sentence ("over 10 classes"): with an
    # underscore, or what the error is about
    *(
        (rf"(?<![-\w]){name}\b", f"--{name.replace('_', '-')}", _SPEC_COMMANDS)
        for name in _SPEC_FLAGS
        if "_" in name
    ),
    *((rf"(?<=error: ){name}\b", f"--{name}", _SPEC_COMMANDS) for name in _SPEC_FLAGS),
)


def _in_flags(line: str, command: str | None) -> str:
    """``line`` with the library's spellings of a fix (:data:`_FLAGS`) in ``command``'s
    flags."""
    import re

    for pattern, flag, commands in _FLAGS:
        if not commands or command in commands:
            line = re.sub(pattern, flag, line)
    return line


def _error_line(e: BaseException) -> str:
    """One line for an error: what went wrong and how to fix it."""
    from costaware.errors import CostawareError

    msg = _first(str(e))
    if isinstance(e, (CliError, CostawareError)):
        return f"costaware: error: {msg or type(e).__name__}"
    if isinstance(e, ImportError):  # in costaware's code: the user's file's are UserCodeError
        extra = _extra_of(e)
        if extra:  # one of costaware's optional dependencies, not installed
            return (
                f"costaware: error: {msg or 'an import failed'}; install it with: "
                f"pip install 'costaware[{extra}]'"
            )
        return f"costaware: error: {msg or 'an import failed'} (--debug shows where)"
    if isinstance(e, OSError) and e.filename is not None:
        what = e.strerror or msg or type(e).__name__
        return f"costaware: error: {what}: {e.filename}"
    if isinstance(e, (ValueError, TypeError, OSError)):
        return f"costaware: error: {msg or type(e).__name__} (--debug shows where)"
    return (
        f"costaware: unexpected {type(e).__name__}: {msg or 'no message'} "
        "(run with --debug for the traceback)"
    )


def _one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    print(f"costaware: warning: {_first(str(message))}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
