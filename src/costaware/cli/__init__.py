"""The ``costaware`` command line.

Every error is one readable line that says what to fix; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["main"]

_EPILOG = "Run 'costaware COMMAND --help' for a command's options."


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line that names the help to read."""

    def error(self, message: str) -> NoReturn:
        print(
            f"costaware: error: {message} (see '{self.prog} --help')",
            file=sys.stderr,
        )
        raise SystemExit(2)


#: packages an ImportError may name, and the extra that installs them
_EXTRAS = {
    "optuna": "optuna",
    "ray": "ray",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "psycopg": "postgres",
    "psycopg2": "postgres",
}


def _load_factory(ref: str) -> Callable[[], Any]:
    """Resolve ``path/to/file.py:name`` or ``package.module:name`` to a callable."""
    if ":" not in ref:
        raise CliError(
            f"expected MODEL as 'path/to/file.py:factory' or 'module:factory', but got {ref!r}."
        )
    where, _, name = ref.rpartition(":")
    if where.endswith(".py") or "/" in where or Path(where).is_file():
        path = Path(where)
        if not path.is_file():
            raise CliError(f"no such file: {where}")
        mod_spec = importlib.util.spec_from_file_location(f"_costaware_user_{path.stem}", path)
        if mod_spec is None or mod_spec.loader is None:
            raise CliError(f"cannot import {where} as a Python file.")
        module = importlib.util.module_from_spec(mod_spec)
        sys.path.insert(0, str(path.resolve().parent))
        try:
            mod_spec.loader.exec_module(module)
        finally:
            sys.path.pop(0)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise CliError(f"cannot import module {where!r}: {e}") from e
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise CliError(f"{where} has no attribute {name!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CliError(
            f"{ref} is not callable; it must be a zero-argument factory returning an nn.Module."
        )
    return obj  # type: ignore[no-any-return]


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().replace("×", "x").split("x"))
    except ValueError:
        raise CliError(f"--input must look like 3x224x224, but got {text!r}.") from None
    if not dims or any(d < 1 for d in dims):
        raise CliError(f"--input must be positive sizes like 3x224x224, but got {text!r}.")
    return dims


def _build_spec(args: argparse.Namespace) -> Any:
    import costaware as ca

    factory = _load_factory(args.model)
    if args.seq_len is not None:
        if args.vocab is None:
            raise CliError("--seq-len needs --vocab (the vocabulary size).")
        batch: Any = ca.TokenBatch(args.seq_len, args.vocab)
    elif args.input is not None:
        shape = _parse_shape(args.input)
        batch = (ca.SegmentationBatch if args.segmentation else ca.ImageBatch)(
            shape, classes=args.classes
        )
    else:
        raise CliError(
            "give the input: --input 3x224x224 for dense inputs, or --seq-len N --vocab V for tokens."
        )
    kwargs = {"lr": args.lr} if args.lr is not None else {}
    return ca.TrainingSpec(
        model=factory,
        batch=batch,
        batch_size=args.batch_size,
        optimizer=args.optimizer,
        optimizer_kwargs=kwargs,
        precision=args.precision,
        dataset_size=args.dataset_size,
        cudnn_benchmark=args.cudnn_benchmark,
        allocator=args.allocator,
        grad_accumulation=args.grad_accumulation,
        epochs=args.epochs,
        name=args.model.rpartition(":")[2],
        world_size=args.world_size,
        sharding=args.sharding,
        wrap_policy=tuple(_load_factory(ref) for ref in args.wrap_policy.split(",") if ref),
    )


def _spec_arguments(p: argparse.ArgumentParser, *, batch_help: str, batch_required: bool) -> None:
    """The arguments that describe one training configuration (``predict``,
    ``max-batch-size``)."""
    p.add_argument(
        "model",
        metavar="MODEL",
        help="'path/to/file.py:factory' or 'module:factory' returning an nn.Module",
    )
    p.add_argument(
        "--batch-size",
        "-b",
        type=int,
        required=batch_required,
        default=None if batch_required else 32,
        help=batch_help,
    )
    p.add_argument(
        "--input", help="per-sample input shape, e.g. 3x224x224 (images) or 784 (vectors)"
    )
    p.add_argument("--classes", type=int, default=1000, help="classes of the label (default 1000)")
    p.add_argument(
        "--segmentation", action="store_true", help="labels per pixel (N×H×W) instead of per sample"
    )
    p.add_argument("--seq-len", type=int, help="tokens per sample, for language models")
    p.add_argument("--vocab", type=int, help="vocabulary size, with --seq-len")
    p.add_argument(
        "--optimizer", default="adamw", help="sgd, adam, adamw, rmsprop, ... (default adamw)"
    )
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument(
        "--precision",
        default="fp32",
        help="fp32, bf16 or fp16 (mixed precision), or bf16-true, fp16-true, fp64-true (pure: "
        "parameters, gradients and optimizer state in that type); default fp32",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="DDP's processes, one per device: predict one rank (default 1: no DDP)",
    )
    p.add_argument(
        "--sharding",
        help="sharded training over --world-size processes instead of DDP: full_shard or "
        "shard_grad_op (FSDP), zero1, zero2 or zero3 (DeepSpeed ZeRO)",
    )
    p.add_argument(
        "--wrap-policy",
        default="",
        help="the module classes FSDP wraps as units, as module:Class (comma-separated); "
        "default none: the whole model is one unit",
    )
    p.add_argument("--dataset-size", type=int, help="samples per epoch, for the epoch time")
    p.add_argument("--epochs", type=int, default=1, help="planned epochs (default 1)")
    p.add_argument(
        "--grad-accumulation", type=int, default=1, help="micro-batches per optimizer step"
    )
    p.add_argument("--allocator", default="default", help="default or expandable_segments")
    p.add_argument(
        "--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark is on"
    )


def _cmd_max_batch_size(args: argparse.Namespace) -> int:
    import costaware as ca
    from costaware.core.batch_size import max_batch_size

    if args.limit < 1:
        raise CliError(f"--limit must be at least 1, but got {args.limit}.")
    spec = _build_spec(args)
    model = ca.CostModel.load(args.model_dir) if args.model_dir else ca.CostModel.default()
    budget = ca.Budget(max_memory=args.max_memory) if args.max_memory else None
    from rich.console import Console

    with Console(stderr=True).status("dry-running and searching batch sizes ...") as status:

        def progress(batch_size: int, decision: Any) -> None:
            status.update(f"batch size {batch_size}: {'fits' if decision.admit else 'rejected'}")

        found = max_batch_size(model, spec, args.device, budget, limit=args.limit, on_try=progress)
    if args.json:
        print(json.dumps(found.to_dict(), indent=2, default=str))
    else:
        print(found)
    return 0 if found.fits else 1


def _cmd_predict(args: argparse.Namespace) -> int:
    import costaware as ca
    from costaware._format import fmt_bytes, fmt_seconds

    spec = _build_spec(args)
    model = ca.CostModel.load(args.model_dir) if args.model_dir else ca.CostModel.default()
    pred = model.predict(spec, device=args.device, exact=True)
    if args.json:
        print(json.dumps(pred.to_dict(), indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(
        title=f"costaware prediction: {spec.display_name} on {pred.device}", title_justify="left"
    )
    table.add_column("quantity")
    table.add_column("predicted", justify="right")
    bound = f"upper bound ({pred.coverage:.0%})" if pred.coverage else "upper bound (heuristic)"
    table.add_column(bound, justify="right")
    table.add_row(
        "peak memory (reserved)", fmt_bytes(pred.peak_memory), fmt_bytes(pred.peak_memory_upper)
    )
    table.add_row(
        "memory it needs (smallest capacity)",
        fmt_bytes(pred.min_capacity),
        fmt_bytes(pred.min_capacity_upper),
    )
    table.add_row(
        "iteration time", fmt_seconds(pred.iteration_time), fmt_seconds(pred.iteration_time_upper)
    )
    if pred.epoch_time is not None:
        table.add_row(
            "epoch time", fmt_seconds(pred.epoch_time), fmt_seconds(pred.epoch_time_upper)
        )
    dev = ca.get_device(pred.device)
    console.print(table)
    fits = pred.min_capacity_upper <= dev.usable_memory_bytes
    verdict = "[green]fits[/green]" if fits else "[red]does not fit[/red]"
    where = f"{verdict} in {pred.device}'s {fmt_bytes(dev.usable_memory_bytes)} usable memory"
    if dev.kind == "cpu":  # no CUDA context to set aside
        console.print(f"{where}.")
    else:
        console.print(f"{where} (of {fmt_bytes(dev.memory_bytes)}; the rest is CUDA context).")
    if args.explain:
        console.print(pred.explain(), markup=False, highlight=False)
    return 0


def _cmd_devices(args: argparse.Namespace) -> int:
    import costaware as ca
    from costaware._format import fmt_bytes

    if args.json:
        print(json.dumps({n: ca.CATALOG[n].to_dict() for n in ca.known_devices()}, indent=2))
        return 0
    if args.sources or not sys.stdout.isatty():  # a pipe gets every name whole
        from costaware.core.compare import catalog_text

        print(catalog_text(sources=args.sources))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Device catalog", title_justify="left")
    for col in ("name", "memory", "bandwidth", "fp32", "bf16", "SMs", "generation"):
        table.add_column(col, justify="left" if col in ("name", "generation") else "right")
    for name in ca.known_devices():
        d = ca.CATALOG[name]
        table.add_row(
            name,
            fmt_bytes(d.memory_bytes),
            f"{d.bandwidth / 1e9:,.0f} GB/s",
            f"{d.peak_flops('fp32') / 1e12:,.1f} TF",
            f"{d.peak_flops('bf16') / 1e12:,.1f} TF" + ("" if d.has_bf16 else " (no bf16)"),
            str(d.sm_count),
            d.generation,
        )
    Console().print(table)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from costaware.cli.compare import run_cli

    return run_cli(args, _build_spec(args))


def _cmd_collect(args: argparse.Namespace) -> int:
    from costaware.measure import collect

    if not args.out and not args.list:
        raise CliError(
            "--out FILE.jsonl.gz is required (for example data/gpu/h100-shard0.jsonl.gz)."
        )
    return collect.run(args)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import costaware as ca
    from costaware.runtime.calibrate import calibrate

    if args.n < 1:
        raise CliError(f"-n must be at least 1, but got {args.n}.")
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


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _cmd_fit(args: argparse.Namespace) -> int:
    import costaware as ca
    from costaware.measure.collect import in_measured_order, observations, read_rows

    files = [Path(p) for p in args.data]
    for f in files:
        if not f.is_file():
            raise CliError(f"no such data file: {f}")
    rows: list[dict[str, Any]] = []
    per_file: dict[str, dict[str, Any]] = {}
    for f in files:
        got = list(read_rows(f))
        per_file[str(f)] = {"sha256": _sha256(f), "rows": len(got), "bytes": f.stat().st_size}
        rows += got
    if not rows:
        raise CliError(f"no rows in {', '.join(map(str, files))}.")
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in in_measured_order(rows):  # the latest row of an (id, device) wins
        seen[(str(r.get("id")), str(r.get("device_name")))] = r
    rows = list(seen.values())
    model = ca.CostModel(
        iterations=args.iterations, random_state=args.seed, thread_count=args.threads
    )
    console = _stderr_console(args.quiet)
    from rich.progress import Progress

    feature_model = ca.CostModel(trace_timeout=args.trace_timeout)
    op_rows = [r for r in rows if r.get("kind") == "op"]
    if op_rows:  # per-op timings: an op-level time model per device kind, whose sums are features
        from costaware.core.optime import fit_op_models

        try:
            op_models, no_model = fit_op_models(
                op_rows, random_state=args.seed, thread_count=args.threads
            )
        except ValueError as e:
            raise CliError(str(e)) from None
        for why in no_model:
            print(why, file=sys.stderr)
        for op_model in op_models:
            feature_model.add_op_model(op_model)
            model.add_op_model(op_model)

    configs = [r for r in rows if r.get("kind") != "op"]
    log = _LogLines(args.quiet or console is not None, len(configs))
    with Progress(console=console, transient=True, disable=console is None) as progress:
        task = progress.add_task("tracing configurations", total=len(rows))

        def on_row(i: int, r: dict[str, Any]) -> None:
            progress.update(task, completed=i, description=str(r.get("id")))
            log.traced(i, str(r.get("id")))

        obs, skipped = observations(
            configs, model=feature_model, cache=args.features_cache, on_row=on_row
        )
    if not obs:
        raise CliError(f"none of the {len(rows)} rows is usable: {'; '.join(skipped[:3])}")
    fitting = f"fitting the memory and time models on {len(obs)} observations"
    if console is not None:
        with console.status(fitting):
            model.fit(obs)
    else:
        log.line(fitting)
        model.fit(obs)
    model.training_["data_files"] = per_file
    model.training_["skipped_rows"] = len(skipped)
    out = model.save(args.out)
    info = {
        "files": per_file,
        "rows_read": len(rows),
        "op_rows": len(op_rows),
        "op_model": sorted(model.__dict__.get("op_models_", {})) or False,
        "observations": len(obs),
        "skipped": skipped,
        "devices": model.training_.get("devices"),
        "families": model.training_.get("families"),
        "command": "costaware fit "
        + " ".join(map(str, args.data))
        + f" --out {args.out} --trace-timeout {args.trace_timeout:g}",
        "costaware": ca.__version__,
    }
    (out / "data.json").write_text(json.dumps(info, indent=2))
    print(
        f"fitted on {len(obs)} observations ({len(skipped)} rows skipped) from "
        f"{len(files)} file(s), devices {', '.join(model.training_.get('devices', []))}; "
        f"saved to {out}"
    )
    return 0


class _LogLines:
    """Progress as plain stderr lines, for ``fit`` where no progress bar shows (a log file,
    CI): a line per ``every`` configurations dry-run (cached ones need none), with the
    elapsed time. Silent when ``quiet`` (or when a progress bar shows instead)."""

    def __init__(self, quiet: bool, total: int, every: int = 25) -> None:
        self.quiet, self.total, self.every = quiet, total, every
        self.count, self.t0 = 0, time.perf_counter()

    def line(self, text: str) -> None:
        if not self.quiet:
            print(f"[fit] {text}", file=sys.stderr, flush=True)

    def traced(self, index: int, name: str) -> None:
        self.count += 1
        if self.count == 1 or self.count % self.every == 0:
            self.line(
                f"dry-running configuration {index + 1} of {self.total} ({name}); "
                f"{self.count} traced, {time.perf_counter() - self.t0:.0f}s"
            )


def _stderr_console(quiet: bool) -> Any:
    """A rich Console on stderr for progress, or None when quiet or not a terminal."""
    if quiet or not sys.stderr.isatty():
        return None
    from rich.console import Console

    return Console(stderr=True)


def _cmd_report(args: argparse.Namespace) -> int:
    from costaware.reporting import report

    if args.study and not (args.storage or args.store or args.source):
        raise CliError("--study names a study in --storage (or in --store); give one of them.")
    if not (args.source or args.storage or args.store or args.ray_dir):
        raise CliError(
            "say what to report on: --storage URL --study NAME (an Optuna study), "
            "--store URL (the observation store) or --ray-dir PATH (a Ray Tune run)."
        )
    if args.source and (args.storage or args.ray_dir):
        raise CliError("give the source once: either SOURCE or --storage / --ray-dir.")
    budget = None
    if args.max_total_time or args.max_cost is not None:
        import costaware as ca

        budget = ca.Budget(
            max_total_time=args.max_total_time,
            max_cost=args.max_cost,
            price_per_hour=args.price_per_hour,
        )
    console = _stderr_console(args.quiet)
    from rich.progress import Progress

    with Progress(console=console, transient=True, disable=console is None) as progress:
        task = progress.add_task("reading", total=None)

        def on_progress(what: str, done: int, total: int) -> None:
            progress.update(task, description=what, completed=done, total=total or None)

        rep = report(
            args.source,
            study=args.study,
            store=args.store,
            storage=args.storage,
            ray_dir=args.ray_dir,
            budget=budget,
            price_per_hour=args.price_per_hour,
            currency=args.currency,
            mode=args.mode,
            title=args.title,
            progress=on_progress,
        )
        written = []
        if args.html:
            rep.to_html(args.html, progress=on_progress)
            written.append(args.html)
        if args.markdown:
            rep.to_markdown(args.markdown)
            written.append(args.markdown)
        if args.json:
            text = json.dumps(rep.to_dict(), indent=2, default=str)
            if args.json == "-":
                print(text)
            else:
                try:
                    Path(args.json).write_text(text + "\n", encoding="utf-8")
                except OSError as e:
                    raise CliError(f"cannot write {args.json}: {e.strerror or e}") from None
                written.append(args.json)
    if not args.quiet and args.json != "-":
        from rich.console import Console

        rep.print(Console())
    for path in written:
        size = Path(path).stat().st_size
        print(
            f"wrote {path} ({size / 1e6:.1f} MB)" if size > 1e5 else f"wrote {path}",
            file=sys.stderr,
        )
    return 0


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="costaware",
        description=(
            "Predict a training configuration's peak GPU memory and epoch time before it runs, "
            "from a dry run on fake tensors (no GPU needed)."
        ),
        epilog=_EPILOG,
    )
    p.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    pr = sub.add_parser(
        "predict",
        help="predict peak memory and time of one configuration",
        description=(
            "Dry-run one training step of MODEL and print its predicted peak memory (the caching "
            "allocator's reserved peak, which decides OOM), iteration and epoch time, with upper bounds. "
            "Example: costaware predict examples/models.py:resnet18 --batch-size 64 --input 3x224x224 "
            "--optimizer adamw --device H100"
        ),
    )
    _spec_arguments(pr, batch_help="samples per step", batch_required=True)
    pr.add_argument(
        "--device", "-d", default="auto", help="catalog name (see 'costaware devices') or auto"
    )
    pr.add_argument("--model-dir", help="a saved CostModel directory (default: the shipped model)")
    pr.add_argument("--json", action="store_true", help="print the prediction as JSON")
    pr.add_argument("--explain", action="store_true", help="also print what the numbers rest on")
    pr.set_defaults(func=_cmd_predict)

    mb = sub.add_parser(
        "max-batch-size",
        help="the largest batch size that fits a device (and a budget), with no step run",
        description=(
            "Search the largest batch size of MODEL whose predicted memory need (the upper bound "
            "of the smallest capacity the step runs in, plus the CUDA context) fits DEVICE, or "
            "a tighter --max-memory. Two dry runs and a few milliseconds per size tried; nothing "
            "runs on a GPU. Example: costaware max-batch-size examples/models.py:resnet18 "
            "--input 3x224x224 --device A10"
        ),
    )
    _spec_arguments(
        mb, batch_help="the batch size the search starts from (default 32)", batch_required=False
    )
    mb.add_argument(
        "--device", "-d", default="auto", help="catalog name (see 'costaware devices') or auto"
    )
    mb.add_argument("--max-memory", help="a memory budget below the device's, e.g. 20GiB or 90%%")
    mb.add_argument(
        "--limit", type=int, default=65_536, help="the largest batch size searched (default 65536)"
    )
    mb.add_argument("--model-dir", help="a saved CostModel directory (default: the shipped model)")
    mb.add_argument("--json", action="store_true", help="print the result as JSON")
    mb.set_defaults(func=_cmd_max_batch_size)

    dv = sub.add_parser(
        "devices",
        help="list the device catalog",
        description="List the GPUs (and the local CPU) costaware knows, with the specs it uses.",
    )
    dv.add_argument("--json", action="store_true", help="print the catalog as JSON")
    dv.add_argument(
        "--sources", action="store_true", help="also say where each device's figures come from"
    )
    dv.set_defaults(func=_cmd_devices)

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

    from costaware.measure.collect import add_arguments

    co = sub.add_parser(
        "collect",
        help="measure a corpus shard for real and append rows to a .jsonl.gz file",
        description=(
            "Measure a shard of the costaware corpus (peak memory, step time) on this machine and "
            "append one JSON row per configuration to a gzip JSONL file; resumes by default. "
            "Example: costaware collect --corpus gpu --shard 0 --device cuda "
            "--out data/gpu/h100-shard0.jsonl.gz --max-minutes 9"
        ),
    )
    add_arguments(co)
    co.set_defaults(func=_cmd_collect)

    fi = sub.add_parser(
        "fit",
        help="fit a CostModel on collected .jsonl.gz files and save it",
        description=(
            "Rebuild every measured configuration, trace it, compute its features and fit the "
            "memory and time residual models. Per-op GPU timings (kind 'op', from "
            "costaware.measure.opbench) among the files first fit the op-level time model, whose sums "
            "over each trace become features. Example: costaware fit data/cpu/*.jsonl.gz --out model/"
        ),
    )
    fi.add_argument("data", nargs="+", metavar="DATA", help="one or more .jsonl.gz files")
    fi.add_argument("--out", required=True, help="directory to save the model to")
    fi.add_argument("--iterations", type=int, default=800, help="CatBoost trees (default 800)")
    fi.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    fi.add_argument("--threads", type=int, default=2, help="CatBoost threads (default 2)")
    fi.add_argument("--quiet", action="store_true", help="no progress bar")
    fi.add_argument(
        "--features-cache",
        help="a .json.gz file of features already computed (reused and updated); default none",
    )
    fi.add_argument(
        "--trace-timeout",
        type=float,
        default=600.0,
        help="seconds allowed for one configuration's dry run; a row over it is skipped and "
        "listed in data.json (default 600)",
    )
    fi.set_defaults(func=_cmd_fit)

    from costaware.runtime.calibrate import RECORD_MODES, SEED, STUDY

    ca_ = sub.add_parser(
        "calibrate",
        help="measure a few corpus models on this machine, so the refit starts from them",
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
    ca_.add_argument(
        "--device",
        "-d",
        default="auto",
        help="auto (a CUDA GPU if there is one), cuda, cuda:N or cpu",
    )
    ca_.add_argument("-n", type=int, default=20, help="configurations to measure (default 20)")
    ca_.add_argument(
        "--store", help="the observation store your study writes to, e.g. sqlite:///costaware.db"
    )
    ca_.add_argument("--study", default=STUDY, help=f"study name to record under (default {STUDY})")
    ca_.add_argument(
        "--record",
        choices=RECORD_MODES,
        default="auto",
        help="record the rows when the correction helps (auto, the default), always, or never",
    )
    ca_.add_argument("--model-dir", help="a saved CostModel directory (default: the shipped model)")
    ca_.add_argument(
        "--seed", type=int, default=SEED, help=f"corpus seed to draw from (default {SEED})"
    )
    ca_.add_argument("--max-minutes", type=float, help="stop measuring after this long")
    ca_.add_argument("--threads", type=int, help="torch CPU threads (default torch's)")
    ca_.add_argument("--json", action="store_true", help="print the result as JSON")
    ca_.add_argument("--quiet", action="store_true", help="no line per configuration")
    ca_.set_defaults(func=_cmd_calibrate)

    rp = sub.add_parser(
        "report",
        help="budget report of an Optuna study, the observation store or a Ray Tune run",
        description=(
            "Where the compute went, which trials were rejected and why, what the rejections "
            "saved, and how far the predictions were from the measurements. Prints a summary; "
            "--html writes one self-contained page (opens offline), --markdown a page for a PR "
            "or a wiki. Examples: "
            "costaware report --storage sqlite:///hpo.db --study digits --store "
            "sqlite:///costaware.db --html report.html | "
            "costaware report --store sqlite:///costaware.db --markdown report.md | "
            "costaware report --ray-dir ~/ray_results/digits --store sqlite:///costaware.db "
            "--mode max --html report.html"
        ),
    )
    rp.add_argument(
        "source",
        nargs="?",
        metavar="SOURCE",
        help="a database URL or SQLite file (an Optuna storage and/or an observation store), "
        "or a Ray Tune experiment directory",
    )
    rp.add_argument("--storage", help="the Optuna storage URL, e.g. sqlite:///hpo.db")
    rp.add_argument("--study", help="the study name (needed when the storage holds several)")
    rp.add_argument(
        "--store",
        help="the observation store the pruner and CostAwareCallback wrote to, "
        "e.g. sqlite:///costaware.db (its measurements join the study's trials)",
    )
    rp.add_argument(
        "--ray-dir", help="a Ray Tune experiment directory (RunConfig storage_path/name)"
    )
    rp.add_argument("--html", metavar="PATH", help="write the HTML report here")
    rp.add_argument("--markdown", "--md", metavar="PATH", help="write the Markdown report here")
    rp.add_argument("--json", metavar="PATH", help="write every figure as JSON here ('-': stdout)")
    rp.add_argument("--price-per-hour", type=float, help="price of one GPU-hour, to show costs")
    rp.add_argument("--currency", default="$", help="currency symbol for costs (default $)")
    rp.add_argument("--max-total-time", help="the study's GPU-time cap, e.g. 8h, if not recorded")
    rp.add_argument("--max-cost", type=float, help="the study's cost cap (needs --price-per-hour)")
    rp.add_argument(
        "--mode",
        choices=("max", "min"),
        help="rank a Ray Tune run's trials (Ray does not record it)",
    )
    rp.add_argument("--title", help="the report's title")
    rp.add_argument("--quiet", "-q", action="store_true", help="no summary, no progress bar")
    rp.set_defaults(func=_cmd_report)

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
    parser = _parser()
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
        print(_error_line(e), file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = shown


def _first(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _error_line(e: BaseException) -> str:
    """One line for an error: what went wrong and how to fix it."""
    from costaware.errors import CostawareError

    msg = _first(str(e))
    if isinstance(e, (CliError, CostawareError)):
        return f"costaware: error: {msg or type(e).__name__}"
    if isinstance(e, ImportError):
        name = (getattr(e, "name", None) or "").split(".")[0]
        extra = _EXTRAS.get(name)
        fix = f"pip install 'costaware[{extra}]'" if extra else f"pip install {name or 'it'}"
        return f"costaware: error: {msg or 'an import failed'}; install it with: {fix}"
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
