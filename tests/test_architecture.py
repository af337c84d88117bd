"""The package's layers, read from its import graph.

Every ``import`` statement counts, at module level and inside functions. The rules:

- no cycles between modules at run time (module-level imports and imports inside
  functions; an import under ``if TYPE_CHECKING:`` never runs, so a module may name the
  type of a module of its own layer that imports it);
- no upward imports, ``TYPE_CHECKING`` ones included. The layers, from the bottom: the
  shared vocabulary at the top of the package (errors, formatting, specs, devices,
  budgets, observations); :mod:`costaware.core` (prediction) and :mod:`costaware.zoo` (the
  architectures), which know nothing of each other; :mod:`costaware.measure`;
  :mod:`costaware.runtime`; :mod:`costaware.integrations` (the adapters, which write the
  records); :mod:`costaware.reporting` (which reads them, and Optuna studies through
  :mod:`costaware.integrations`); :mod:`costaware.cli` on top, with the package's
  ``__main__`` (``python -m costaware``), the same command's other entry point;
- only :mod:`costaware.integrations` imports an HPO framework (Optuna, Ray, Lightning);
- code names modules by their paths in the layers, not by the flat paths
  :mod:`costaware._moved` keeps for users.

The package's ``__init__`` is the public facade: its names are imported on first use,
so its ``TYPE_CHECKING`` block (the facade's names, for type checkers) is not a
dependency of the modules that ``import costaware``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "costaware"

#: layer of a module (the first part below the package, or "shared") -> rank; a module
#: may import its own layer or one of lower rank, never another layer of its own rank
RANKS: dict[str, int] = {
    "shared": 0,
    "core": 1,
    "zoo": 1,
    "measure": 2,
    "runtime": 3,
    "integrations": 5,
    "reporting": 6,
    "cli": 7,
}
FRAMEWORKS = frozenset({"optuna", "ray", "lightning", "pytorch_lightning"})


def modules(src: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``src``: dotted name -> file."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of the statements under ``if TYPE_CHECKING:`` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                inside.update(id(n) for n in ast.walk(stmt))
    return inside


def imports(name: str, path: Path, known: set[str]) -> Iterator[tuple[str, bool]]:
    """The modules ``name`` imports anywhere in its file (absolute names, resolved to a
    module of ``known`` where an imported name is a submodule), each with whether the
    import runs (False under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    type_only = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        runs = id(node) not in type_only
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, runs
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            sub = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
            for target in sub:
                yield target, runs
            if len(sub) < len(node.names):
                yield mod, runs


def import_graph(src: Path, package: str) -> nx.DiGraph:
    """The package's modules and their imports. An edge's ``runs`` says whether one of its
    imports runs; a node's ``external`` holds the top-level names of the packages outside
    this one that the module imports, ``imported`` every module name it imports."""
    found = modules(src, package)
    known = set(found)
    graph = nx.DiGraph()
    for name in found:
        graph.add_node(name, external=set(), imported=set())
    for name, path in found.items():
        facade = name == package
        for target, runs in imports(name, path, known):
            if facade and not runs:
                continue  # the facade's lazy names, spelled out for type checkers
            graph.nodes[name]["imported"].add(target)
            top = target.split(".")[0]
            if top != package:
                graph.nodes[name]["external"].add(top)
                continue
            while target not in known and "." in target:
                target = target.rpartition(".")[0]  # an attribute of a module
            if target == name:
                continue
            if graph.has_edge(name, target):
                graph.edges[name, target]["runs"] |= runs
            else:
                graph.add_edge(name, target, runs=runs)
    return graph


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Each group of modules that import each other at run time, directly or through
    others."""
    running = graph.edge_subgraph([(a, b) for a, b, runs in graph.edges(data="runs") if runs])
    return sorted(sorted(g) for g in nx.strongly_connected_components(running) if len(g) > 1)


def layer(name: str, package: str = PACKAGE) -> str:
    parts = name.split(".")
    if parts[1:] == ["__main__"]:
        return "cli"  # ``python -m costaware``: the command line's entry point
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANKS):
        return parts[1]
    return "shared"


def upward(graph: nx.DiGraph) -> list[str]:
    """Each import of a higher layer, or of another layer of the same rank."""
    bad = []
    for a, b in sorted(graph.edges):
        la, lb = layer(a), layer(b)
        if la != lb and RANKS[lb] >= RANKS[la]:
            bad.append(f"{a} ({la}) imports {b} ({lb})")
    return bad


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    return import_graph(SRC, PACKAGE)


def test_every_module_is_in_a_layer(graph: nx.DiGraph) -> None:
    assert {layer(n) for n in graph} <= set(RANKS)
    assert len(graph) > 30  # the walk found the package


def test_no_import_cycles(graph: nx.DiGraph) -> None:
    assert cycles(graph) == []


def test_no_upward_imports(graph: nx.DiGraph) -> None:
    assert upward(graph) == []


def test_only_the_integrations_import_an_hpo_framework(graph: nx.DiGraph) -> None:
    users = {
        n: sorted(graph.nodes[n]["external"] & FRAMEWORKS)
        for n in graph
        if graph.nodes[n]["external"] & FRAMEWORKS and layer(n) != "integrations"
    }
    assert users == {}


def test_code_names_the_moved_modules_by_their_new_paths(graph: nx.DiGraph) -> None:
    from costaware._moved import MOVED

    old = {n: sorted(graph.nodes[n]["imported"] & set(MOVED)) for n in graph}
    assert {n: o for n, o in old.items() if o} == {}
    for folder in ("tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            named = {target for target, _ in imports(path.stem, path, set())} & set(MOVED)
            assert not named, f"{path.relative_to(ROOT)} imports {sorted(named)}"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_cycle_hidden_in_a_function_is_caught(tmp_path: Path) -> None:
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/a.py": "from pkg.core.b import thing\n",
            "core/b.py": "def thing():\n    from pkg.core import a\n    return a\n",
            "core/c.py": "import pkg.core.b\nfrom pkg.core import d\n",
            "core/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.core.c import x\n",
        },
    )
    # a <-> b runs (b's import inside a function); d's import of c is for the type checker
    assert cycles(import_graph(src, "pkg")) == [["pkg.core.a", "pkg.core.b"]]


def test_an_upward_import_and_a_framework_import_are_caught(tmp_path: Path) -> None:
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "",
            "core/__init__.py": "",
            "core/model.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.runtime.store import Store\n",
            "runtime/__init__.py": "",
            "runtime/store.py": "from pkg import errors\nimport optuna\n",
        },
    )
    g = import_graph(src, "pkg")
    assert upward(g) == ["pkg.core.model (core) imports pkg.runtime.store (runtime)"]
    assert g.nodes["pkg.runtime.store"]["external"] == {"optuna"}
    assert ("pkg.runtime.store", "pkg.errors") in g.edges
