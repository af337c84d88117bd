"""The examples a new user runs first keep working."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_optuna_quickstart_runs_and_rejects(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "optuna_quickstart.py"),
            "--trials",
            "8",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "8 trials in" in out
    assert "rejected before they ran" in out
    # at least one rejection names its number (with more decimals when they are that close)
    assert re.search(r"exceeds the 160(\.0+)? MiB budget", out)
    # the study's predictions and the shipped model's, scored on the same measured trials
    assert re.search(r"epoch time +\d+% / \d+%", out)
    assert (tmp_path / "costaware.db").is_file() and (tmp_path / "hpo.db").is_file()
    assert (tmp_path / "costaware.db.costaware-models" / "LATEST").is_file()  # refitted and shared


@pytest.mark.slow
def test_predict_demo_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "predict_demo.py"), "--device", "A100"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        cwd=ROOT / "examples",
    ).stdout
    assert "ResNet-50" in out and "reject" in out and "What one prediction rests on" in out


# --------------------------------------------------------------------------------------
# every example runs from a pip install: no import beyond the extras its docstring names
# --------------------------------------------------------------------------------------
def _requirement_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _extras() -> tuple[set[str], dict[str, set[str]]]:
    """The distributions costaware installs, and those each extra adds (``all`` resolved)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    extras: dict[str, set[str]] = {}
    for name, reqs in project["optional-dependencies"].items():
        found: set[str] = set()
        for r in reqs:
            if (m := re.match(r"costaware\[(.*)\]", r.strip())) is not None:
                for inner in m.group(1).split(","):
                    found |= {_requirement_name(x) for x in project["optional-dependencies"][inner]}
            else:
                found.add(_requirement_name(r))
        extras[name] = found
    return base, extras


def _imported(path: Path) -> set[str]:
    """The top-level modules a file imports (``costaware.integrations.optuna`` kept whole)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    out = set()
    for name in names:
        parts = name.split(".")
        out.add(".".join(parts[:3]) if parts[:2] == ["costaware", "integrations"] else parts[0])
    return out


def _needs(path: Path) -> set[str]:
    """The extras an example's docstring names on its ``Needs:`` line."""
    m = re.search(r"Needs: ``pip install '?costaware(?:\[([a-z,]*)\])?'?``", path.read_text())
    return set(m.group(1).split(",")) if m and m.group(1) else set()


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_every_example_imports_only_what_its_extras_install(path: Path) -> None:
    """``pip install 'costaware[<the extras the example names>]'`` is enough to run it: it
    imports no dev-only package (scikit-learn is in the dev extra alone)."""
    import importlib.metadata

    base, extras = _extras()
    local = {p.stem for p in (ROOT / "examples").glob("*.py")}
    needs = _needs(path)
    assert needs <= set(extras), f"{path.name} names unknown extras {needs - set(extras)}"
    allowed = base | {"costaware"}
    for extra in needs:
        allowed |= extras[extra]
    dists = importlib.metadata.packages_distributions()
    missing = []
    for module in sorted(_imported(path)):
        if module in sys.stdlib_module_names or module in local or module == "costaware":
            continue
        if module.startswith("costaware.integrations."):
            extra = module.rsplit(".", 1)[1]
            if extra not in needs:
                missing.append(f"{module} (the {extra} extra)")
            continue
        owners = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if not owners & allowed:
            missing.append(f"{module} (from {', '.join(sorted(owners))})")
    assert not missing, (
        f"{path.name} imports what its extras {sorted(needs)} do not install: {missing}"
    )
    beyond_base = needs or any(m.startswith("costaware.integrations.") for m in _imported(path))
    if beyond_base:
        assert "Needs: ``pip install" in path.read_text(), f"{path.name} says not what to install"


def test_the_import_check_catches_a_dev_only_import(tmp_path: Path) -> None:
    """The check above is not vacuous: scikit-learn is only in the dev extra."""
    base, extras = _extras()
    assert "scikit-learn" not in base and "scikit-learn" in extras["dev"]
    assert not any("scikit-learn" in extras[e] for e in ("optuna", "lightning", "ray", "all"))
    fake = tmp_path / "x.py"
    fake.write_text('"""Needs: ``pip install \'costaware[optuna]\'``"""\nimport sklearn\n')
    assert _imported(fake) == {"sklearn"} and _needs(fake) == {"optuna"}
