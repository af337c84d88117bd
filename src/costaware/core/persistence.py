"""Saving and loading a :class:`~costaware.core.model.CostModel`: CatBoost ``.cbm`` files
and a JSON manifest per model folder (the per-kind models, the base of a refit, the graph
embedding and the op-level time models in sub-folders and files of it). Every file a
manifest lists is checked against the sha256 it records before anything parses it.
Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costaware.core.features import FEATURE_VERSION
from costaware.core.learned import CapacityFit, TargetFit
from costaware.core.optime import OpTimeModel
from costaware.core.residuals import _Affine, _Constant, _group_columns, _PrecisionLine
from costaware.core.step_models import _CpuSteps, _Dispatch
from costaware.errors import CostawareError, NotFittedError, first_line

if TYPE_CHECKING:
    from costaware.core.model import CostModel

__all__ = ["FORMAT_VERSION", "MANIFEST", "read_model", "save_model"]

MANIFEST = "manifest.json"
#: the most parts (per-kind models, bases) deep a saved model's folders may nest: a refit
#: over the shipped model nests three (kind / base / kind); deeper, a manifest is malformed
_MAX_NESTING = 16
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: a device kind's sub-folder name ("cpu", "cuda"): one plain name, never "." or ".."
_KIND_NAME = re.compile(r"[A-Za-z0-9_-]+")
#: a file's name inside a model's folder: no path separator, no leading dot
_FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
FORMAT_VERSION = 1


def save_model(model: CostModel, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` to directory ``path``: ``.cbm`` files and ``manifest.json``
    (:meth:`CostModel.save <costaware.CostModel.save>`)."""
    if not model.is_fitted:
        raise NotFittedError(
            "this CostModel is not fitted; there is nothing to save (call fit first)."
        )
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for which, target in (("memory", model.memory_), ("time", model.time_)):
        if target is None:
            (out / f"{which}.cbm").unlink(missing_ok=True)
            continue
        m = target.model
        entry: dict[str, Any]
        if isinstance(m, _Affine):
            entry = {"affine": {"intercept": m.intercept, "slope": m.slope}}
        elif isinstance(m, _PrecisionLine):
            entry = {"by_precision": dict(m.by_group), "log_slope": m.slope, "span": dict(m.span)}
        elif isinstance(m, _Constant):
            entry = {"constant": m.value}
        else:
            m.save_model(str(out / f"{which}.cbm"), format="cbm")
            entry = {"file": f"{which}.cbm"}
        if "file" not in entry:  # no trees: a stale .cbm of an earlier fit must not linger
            (out / f"{which}.cbm").unlink(missing_ok=True)
        entry["conformal_quantile"] = None if target.from_base else target.q
        if target.from_base:
            entry["bound"] = "base"
        entry["shift"] = float(target.shift)
        if target.bounds:
            entry["bounds_by_group"] = {
                g: {"shift": b[0], "quantile": b[1], "coverage": b[2]}
                for g, b in target.bounds.items()
            }
        entry["coverage"] = target.coverage
        files[which] = entry
    for kind, sub in model.kinds_.items():
        sub.save(out / kind)
    g2v = model.graph2vec_
    if g2v is not None:
        g2v.save(out / "graph2vec")
    base = model.base_
    if base is not None:
        base.save(out / "base")
    for kind, op_model in sorted(model.op_models_.items()):
        # a GPU's is "op_time" in optime.cbm, as before there were CPU op models
        key, name = (
            ("op_time", "optime") if kind == "cuda" else (f"op_time_{kind}", f"optime-{kind}")
        )
        files[key] = op_model.save(out / f"{name}.cbm")
    manifest = {
        "format_version": FORMAT_VERSION,
        "feature_version": FEATURE_VERSION,
        "feature_names": model.feature_names_,
        "params": model.get_params(),
        "models": files,
        "graph2vec": g2v is not None,
        "base": base is not None,
        "kinds": sorted(model.kinds_),
        "dispatch": asdict(d) if (d := model.dispatch_) is not None else None,
        "cpu_steps": asdict(c) if (c := model.cpu_steps_) is not None else None,
        "capacity": (
            {
                "quantile": float(cap.q),
                "shift": float(cap.shift),
                "coverage": float(cap.coverage),
                "rows": int(cap.rows),
            }
            if (cap := model.capacity_) is not None
            else None
        ),
        "training": model.training_,
    }
    if (measured := model.time_measured_) is not None:
        manifest["time_measured"] = measured
    if (gap := model.step_gap_) is not None:
        manifest["step_gap"] = gap
    # every file load reads from this level, verified before anything parses it: the
    # .cbm files (a damaged one can crash CatBoost), graph2vec's, and the per-kind and
    # base manifests (each verifies its own files in turn)
    listed = [e["file"] for e in files.values() if "file" in e]
    if g2v is not None:
        from costaware.core.graph2vec import ARRAYS_NAME, JSON_NAME

        listed += [f"graph2vec/{JSON_NAME}", f"graph2vec/{ARRAYS_NAME}"]
    listed += [f"{k}/{MANIFEST}" for k in sorted(model.kinds_)]
    if base is not None:
        listed.append(f"base/{MANIFEST}")
    manifest["sha256"] = {name: _sha256(out / name) for name in sorted(listed)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return out


def read_model(
    cls: type[CostModel], root: Path, seen: tuple[Path, ...], unverified: list[Path]
) -> CostModel:
    """The model of class ``cls`` saved in ``root`` (:meth:`CostModel.load
    <costaware.CostModel.load>`), a part (per-kind, base) of the models in ``seen``
    (their resolved folders), adding the folders without checksums to ``unverified``."""
    mpath = root / MANIFEST
    here = _part_folder(root, seen)
    manifest = _manifest(root)
    sums = manifest.get("sha256")
    if sums is None:
        unverified.append(root)
    elif not (
        isinstance(sums, dict)
        and all(isinstance(v, str) and _SHA256.fullmatch(v) for v in sums.values())
    ):
        raise CostawareError(
            f"{mpath}: 'sha256' must map file names to hex sha256 digests, but got "
            f"{str(sums)[:120]}; the manifest is damaged."
        )
    kinds = manifest.get("kinds") or []
    if not isinstance(kinds, list) or not all(
        isinstance(k, str) and _KIND_NAME.fullmatch(k) for k in kinds
    ):
        raise CostawareError(
            f"{mpath}: 'kinds' must list device kinds like ['cpu', 'cuda'] (each a "
            f"sub-folder of the model), but got {str(kinds)[:120]}; the manifest is "
            "malformed."
        )
    read = _verified_reader(root, sums)
    try:
        model = cls(**manifest["params"])
        model.feature_names_ = [str(n) for n in manifest["feature_names"]]
        model.training_ = dict(manifest.get("training") or {})
        for which, info in dict(manifest["models"]).items():
            if which.startswith("op_time"):
                read(info["file"])  # verified here, then read by OpTimeModel.load
                model.add_op_model(OpTimeModel.load(root, info))
                continue
            target = _target_fit(info, model, root, read)
            if which == "memory":
                model.memory_ = target
            elif which == "time":
                model.time_ = target
        _read_parts(model, manifest, kinds, root, (*seen, here), read, unverified)
    except (CostawareError, OSError):
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise CostawareError(
            f"{mpath} is not a CostModel manifest this costaware can read "
            f"({first_line(e)}); the model is damaged or malformed."
        ) from e
    return model


def _part_folder(root: Path, seen: tuple[Path, ...]) -> Path:
    """The resolved folder of the model saved in ``root``, checked to hold a manifest and
    to be no folder of the models ``seen`` (a part naming its own model, or a folder above
    it, would be read for ever) nor nested deeper than any saved model."""
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise FileNotFoundError(f"no {MANIFEST} in {root}: not a saved CostModel directory.")
    here = root.resolve()
    if here in seen:
        raise CostawareError(
            f"{seen[-1] / MANIFEST} lists a part at {root}, which is {here}: the model "
            "itself or a folder it is in. A saved model's 'kinds' and 'base' name "
            "sub-folders of it; this manifest is malformed."
        )
    if len(seen) >= _MAX_NESTING:
        raise CostawareError(
            f"{mpath} is nested {len(seen)} parts deep (kinds, bases), more than any "
            f"saved model has ({_MAX_NESTING}); its manifests are malformed."
        )
    return here


def _manifest(root: Path) -> dict[str, Any]:
    """The manifest in ``root``: a JSON object written for this costaware's feature
    version."""
    mpath = root / MANIFEST
    try:
        manifest = json.loads(mpath.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CostawareError(f"{mpath} is not valid JSON ({e}): the model is damaged.") from e
    if not isinstance(manifest, dict):
        raise CostawareError(
            f"{mpath} holds a JSON {type(manifest).__name__}, but a CostModel manifest "
            "is an object; the model is damaged."
        )
    if manifest.get("feature_version") != FEATURE_VERSION:
        raise CostawareError(
            f"the model at {root} uses feature version {manifest.get('feature_version')!r}, "
            f"but this costaware computes version {FEATURE_VERSION!r}; refit it with `costaware fit`."
        )
    return manifest


def _verified_reader(root: Path, sums: dict[str, str] | None) -> Callable[[Any], bytes]:
    """A reader of the files of the model in ``root``: the bytes of a file its manifest
    lists, verified against the manifest's checksums ``sums`` (None: unverified) before
    anything parses them."""
    mpath = root / MANIFEST

    def read(name: Any) -> bytes:
        if not isinstance(name, str) or not _part_name(name):
            raise CostawareError(
                f"{mpath} lists the file {name!r}, but a saved model's files are plain "
                "names inside its folder; the manifest is malformed."
            )
        data = (root / name).read_bytes()
        if sums is not None:
            want = sums.get(name)
            if want is None:
                raise CostawareError(
                    f"{mpath} records no sha256 for {name}, which it lists: the manifest "
                    "is malformed, and the file is not read unverified."
                )
            got = hashlib.sha256(data).hexdigest()
            if got != want:
                raise CostawareError(
                    f"{root / name} is damaged: its sha256 is {got[:16]}..., but {mpath} "
                    f"records {want[:16]}... for it. The file changed after the model was "
                    "saved; it is not read. Restore the model from an intact copy, or "
                    "refit it."
                )
        return data

    return read


def _target_fit(
    info: dict[str, Any], model: CostModel, root: Path, read: Callable[[Any], bytes]
) -> TargetFit:
    """A target's residual model and bound as its manifest entry ``info`` records them
    (trees in a verified ``.cbm`` file, or a line, per-precision factors or a constant)."""
    from catboost import CatBoostError, CatBoostRegressor

    m: Any
    if "affine" in info:
        m = _Affine(float(info["affine"]["intercept"]), float(info["affine"]["slope"]))
    elif "by_precision" in info:
        m = _PrecisionLine(
            {str(g): float(v) for g, v in info["by_precision"].items()},
            _group_columns(model.feature_names_),
            float(info.get("log_slope", 0.0)),
            {str(g): float(v) for g, v in (info.get("span") or {}).items()},
        )
    elif "constant" in info:
        m = _Constant(float(info["constant"]))
    else:
        blob = read(info["file"])
        m = CatBoostRegressor()
        try:
            m.load_model(blob=blob)
        except CatBoostError as e:
            raise CostawareError(
                f"CatBoost could not read {root / info['file']}: {first_line(e)}"
            ) from e
    q = info["conformal_quantile"]
    q = math.nan if q is None else float(q)
    from_base = info.get("bound") == "base"
    shift = float(info.get("shift", 0.0))
    bounds = {
        str(g): (float(b["shift"]), float(b["quantile"]), float(b["coverage"]))
        for g, b in (info.get("bounds_by_group") or {}).items()
    }
    coverage = float(info.get("coverage", model.coverage))
    return TargetFit(m, q=q, coverage=coverage, shift=shift, bounds=bounds, from_base=from_base)


def _read_parts(
    model: CostModel,
    manifest: dict[str, Any],
    kinds: list[str],
    root: Path,
    parts: tuple[Path, ...],
    read: Callable[[Any], bytes],
    unverified: list[Path],
) -> None:
    """The rest of ``model`` as ``manifest`` records it: its base and per-kind models
    (read from their sub-folders of ``root``, below the models in ``parts``), step
    models, capacity bound, a refit's measured times and the graph embedding."""
    cls = type(model)
    model.base_ = None
    if manifest.get("base"):
        read(f"base/{MANIFEST}")
        model.base_ = read_model(cls, root / "base", parts, unverified)
    if manifest.get("dispatch"):
        model.dispatch_ = _Dispatch(**manifest["dispatch"])
    if manifest.get("cpu_steps"):
        model.cpu_steps_ = _CpuSteps(**manifest["cpu_steps"])
    if capacity := manifest.get("capacity"):
        model.capacity_ = CapacityFit(
            q=float(capacity["quantile"]),
            shift=float(capacity["shift"]),
            coverage=float(capacity["coverage"]),
            rows=int(capacity.get("rows", 0)),
        )
    if (measured := manifest.get("time_measured")) is not None:
        model.time_measured_ = {str(k): (float(v[0]), int(v[1])) for k, v in measured.items()}
    if (gap := manifest.get("step_gap")) is not None:
        model.step_gap_ = float(gap)
    if kinds:
        for k in kinds:
            read(f"{k}/{MANIFEST}")
        model.kinds_ = {k: read_model(cls, root / k, parts, unverified) for k in kinds}
    if manifest.get("graph2vec"):
        from costaware.core.graph2vec import ARRAYS_NAME, JSON_NAME, Graph2Vec

        read(f"graph2vec/{JSON_NAME}")
        read(f"graph2vec/{ARRAYS_NAME}")
        model.graph2vec_ = Graph2Vec.load(root / "graph2vec")


def _sha256(path: Path) -> str:
    """The hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _part_name(name: str) -> bool:
    """Whether ``name`` is a file inside a model's folder as :meth:`CostModel.save` names
    one: a plain name, or a sub-folder's (a kind, ``base``, ``graph2vec``) plain name;
    never absolute, never ``..``."""
    parts = name.split("/")
    return 1 <= len(parts) <= 2 and all(_FILE_NAME.fullmatch(p) for p in parts)
