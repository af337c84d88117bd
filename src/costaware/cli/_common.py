"""What the commands share: the user error (:class:`CliError`) and the training
configuration's options and how a spec is built from them, the parser whose usage errors
are one line."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["CliError"]

#: the default largest batch size ``max-batch-size`` and ``compare`` search, written here
#: so that building the parser does not import torch; it is
#: :data:`costaware.core.batch_size.DEFAULT_LIMIT` (tests/cli check)
_SEARCH_LIMIT = 65_536


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
            _run_user_module(where, lambda: mod_spec.loader.exec_module(module))  # type: ignore[union-attr]
        finally:
            sys.path.pop(0)
    else:
        module = _run_user_module(where, lambda: importlib.import_module(where))
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


def _run_user_module(where: str, run: Callable[[], Any]) -> Any:
    """``run()``, the import of the module MODEL names. An error its code raises, a failed
    import included (``from torch import nnn``, ``import timmm``), is the user's, raised as
    :class:`~costaware.errors.UserCodeError` that names the line, not as costaware's. Only
    a module MODEL names that does not exist is a :class:`CliError` of its own."""
    try:
        return run()
    except Exception as e:
        if isinstance(e, ModuleNotFoundError) and _names_the_reference(e, where):
            raise CliError(f"cannot import module {where!r}: {e}") from e
        from costaware.core.trace.user_code import _said, _where
        from costaware.errors import user_code_error

        at = _where(e)
        if isinstance(e, SyntaxError) and e.filename:
            at = f"at {e.filename}:{e.lineno}"
        hint = ""
        extra = _extra_of(e)
        if extra:
            hint = f" (pip install 'costaware[{extra}]' installs it)"
        raise user_code_error(
            f"importing {where} raised {_said(e)} {at}{hint}. This is that "
            "module's own code, not costaware's: it fails the same way when Python imports "
            "it (--debug shows the traceback).",
            e,
        ) from e


#: costaware's optional dependencies (its extras) a ModuleNotFoundError may name, and the
#: extra that installs them
_EXTRAS = {
    "optuna": "optuna",
    "ray": "ray",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "psycopg": "postgres",
    "psycopg2": "postgres",
}


def _extra_of(e: BaseException) -> str | None:
    """The extra of costaware's that installs the missing module an ImportError names, or
    None: for any other (``cannot import name``, a missing submodule of an installed
    package, a typo, a package of the user's own) there is nothing of costaware's to
    install."""
    if not isinstance(e, ImportError) or str(e).startswith("cannot import name"):
        return None
    return _EXTRAS.get(e.name or "")


def _names_the_reference(e: ModuleNotFoundError, where: str) -> bool:
    """Whether ``e`` says the module MODEL names (``pkg.sub``), or a package above it, does
    not exist, rather than that the module's own code imports something missing."""
    parts = where.split(".")
    return e.name in {".".join(parts[: i + 1]) for i in range(len(parts))}


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
    if args.vocab is not None and args.seq_len is None:
        raise CliError("--vocab needs --seq-len (the tokens per sample).")
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
        max_steps=args.max_steps,
        max_time=args.max_time,
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
        help="sharded training over --world-size processes instead of DDP: full_shard, "
        "shard_grad_op or no_shard (FSDP), zero1, zero2 or zero3 (DeepSpeed ZeRO)",
    )
    p.add_argument(
        "--wrap-policy",
        default="",
        help="the module classes FSDP wraps as units, as module:Class (comma-separated); "
        "default none: the whole model is one unit",
    )
    p.add_argument(
        "--dataset-size",
        type=int,
        help="samples per epoch, for the epoch time (under --world-size, the whole dataset: "
        "each rank steps through its share)",
    )
    p.add_argument("--epochs", type=int, default=1, help="planned epochs (default 1)")
    p.add_argument(
        "--max-steps",
        type=int,
        help="optimizer steps after which training stops (Lightning's max_steps): the trial "
        "time is that of the shorter of --epochs and these steps",
    )
    p.add_argument(
        "--max-time",
        help="a time limit after which training stops (Lightning's max_time), e.g. 30min or "
        "1h30m: the trial time is at most this",
    )
    p.add_argument(
        "--grad-accumulation", type=int, default=1, help="micro-batches per optimizer step"
    )
    p.add_argument("--allocator", default="default", help="default or expandable_segments")
    p.add_argument(
        "--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark is on"
    )


def _stderr_console(quiet: bool) -> Any:
    """A rich Console on stderr for progress, or None when quiet or not a terminal."""
    if quiet or not sys.stderr.isatty():
        return None
    from rich.console import Console

    return Console(stderr=True)


def _device_arguments(p: argparse.ArgumentParser) -> None:
    """``--device`` and ``--device-file``: the one device of ``predict`` and
    ``max-batch-size``, a catalog GPU or one of the user's own."""
    p.add_argument(
        "--device",
        "-d",
        default="auto",
        help="catalog name or alias (see 'costaware devices'), a device of --device-file, "
        "or auto (the local GPU, else the CPU; the default)",
    )
    _device_file_argument(p, "that --device may name")


def _device_file_argument(p: argparse.ArgumentParser, how: str) -> None:
    """``--device-file``: devices of the user's own, described as in docs/compare.md."""
    p.add_argument(
        "--device-file",
        action="append",
        metavar="PATH",
        help=f"a JSON or TOML file of your own devices (docs/compare.md), {how}; repeatable",
    )


def _own_devices(args: argparse.Namespace) -> list[Any]:
    """The devices of every ``--device-file``; two that one name would match are refused."""
    from costaware.device_files import load_devices, same_name

    paths = args.device_file or ()
    devices: list[Any] = []
    try:
        for path in paths:
            devices += load_devices(path)
        same_name(devices, "--device-file " + ", ".join(map(str, paths)))
    except ValueError as e:
        raise CliError(str(e)) from None
    return devices


def _device(args: argparse.Namespace) -> Any:
    """The :class:`~costaware.Device` ``--device`` names, among ``--device-file``'s devices
    and the catalog's (``auto``: the local one)."""
    from costaware.devices import get_device

    return get_device(args.device, own=_own_devices(args))
