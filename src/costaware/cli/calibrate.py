"""``costaware calibrate``: measure a few corpus models on this machine (:func:`costaware.runtime.calibrate.calibrate` does the work)."""

from __future__ import annotations

import argparse
import json

from costaware.cli._common import (
    CliError,
    _Parser,
)

__all__ = ["HELP", "add_parser", "run"]

#: the command's line in ``costaware --help``
HELP = "measure a few corpus models on this machine, so the refit starts from them"


def add_parser(sub: argparse._SubParsersAction[_Parser]) -> _Parser:
    """The ``costaware calibrate`` command and its options, on the sub-parsers ``sub``."""
    from costaware.runtime.calibrate import RECORD_MODES, SEED, STUDY

    p = sub.add_parser(
        "calibrate",
        help=HELP,
        description=(
            "Before a study on hardware the shipped model never saw: measure N small corpus "
            "configurations here (20 by default: under a minute on this 2-core CPU), compare them with the "
            "predictions, and judge whether a correction fitted on them predicts left-out "
            "ones better. With --store, the rows are recorded there as study "
            f"'{STUDY}' when it does, and the online refit of the integrations "
            "(refit_every, over the same store) starts from them. Example: costaware "
            "calibrate --device cuda --store sqlite:///costaware.db"
        ),
    )
    p.add_argument(
        "--device",
        "-d",
        default="auto",
        help="auto (a CUDA GPU if there is one), cuda, cuda:N or cpu",
    )
    p.add_argument("-n", type=int, default=20, help="configurations to measure (default 20)")
    p.add_argument(
        "--store", help="the observation store your study writes to, e.g. sqlite:///costaware.db"
    )
    p.add_argument("--study", default=STUDY, help=f"study name to record under (default {STUDY})")
    p.add_argument(
        "--record",
        choices=RECORD_MODES,
        default="auto",
        help="record the rows when the correction helps (auto, the default), always, or never",
    )
    p.add_argument("--model-dir", help="a saved CostModel directory (default: the shipped model)")
    p.add_argument(
        "--seed", type=int, default=SEED, help=f"corpus seed to draw from (default {SEED})"
    )
    p.add_argument("--max-minutes", type=float, help="stop measuring after this long")
    p.add_argument("--threads", type=int, help="torch CPU threads (default torch's)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no line per configuration")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import costaware as ca
    from costaware.runtime.calibrate import calibrate

    if args.n < 1:
        raise CliError(f"-n must be at least 1, but got {args.n}.")
    if args.record == "always" and args.store is None:
        raise CliError("--record always needs --store: the store to record the rows in.")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    model = ca.CostModel.load(args.model_dir) if args.model_dir else None
    result = calibrate(
        args.device,
        n=args.n,
        store=args.store,
        study=args.study,
        record=args.record,
        model=model,
        seed=args.seed,
        max_minutes=args.max_minutes,
        progress=not args.quiet and not args.json,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result)
        if args.store is None:
            print("  (no --store given: pass the one your study writes to, to record the rows)")
    return 0
