"""Tests for costaware.core.graph2vec (WL words, PV-DBOW fit/transform, pickle-free persistence)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import numpy.typing as npt
import pytest

import costaware.core.graph2vec as g2v
from costaware.core.graph2vec import Graph2Vec, wl_words
from costaware.errors import NotFittedError

SRC_DIR = Path(__file__).resolve().parents[2] / "src" / "costaware"

# --------------------------------------------------------------------------- synthetic graphs


def chain(ops: list[str], skips: Sequence[tuple[int, int]] = ()) -> nx.DiGraph:
    """A chain ops[0] -> ops[1] -> ... plus extra (src, dst) edges."""
    g = nx.DiGraph()
    for i, op in enumerate(ops):
        g.add_node(i, op=op)
        if i:
            g.add_edge(i - 1, i)
    g.add_edges_from(skips)
    return g


def cnn(blocks: int) -> nx.DiGraph:
    """conv -> bn -> relu blocks with a residual add every two blocks (forward + some backward)."""
    ops: list[str] = []
    skips: list[tuple[int, int]] = []
    for b in range(blocks):
        start = len(ops)
        ops += ["convolution", "native_batch_norm", "relu"]
        if b % 2 == 1:
            ops.append("add")
            skips.append((start - 1, len(ops) - 1))
    ops += ["mean", "addmm", "log_softmax"]
    ops += ["relu_backward", "native_batch_norm_backward", "convolution_backward"] * blocks
    return chain(ops, skips)


def transformer(layers: int) -> nx.DiGraph:
    """addmm -> view -> bmm -> softmax -> bmm -> addmm -> add -> layer_norm -> addmm -> gelu ..."""
    ops: list[str] = ["embedding"]
    skips: list[tuple[int, int]] = []
    for _ in range(layers):
        start = len(ops) - 1
        ops += ["addmm", "view", "bmm", "_softmax", "bmm", "addmm", "add", "native_layer_norm"]
        skips.append((start, len(ops) - 2))
        ops += ["addmm", "gelu", "addmm", "add", "native_layer_norm"]
    ops += ["addmm", "_log_softmax", "nll_loss_forward"]
    ops += ["_softmax_backward_data", "bmm", "gelu_backward", "mm"] * layers
    return chain(ops, skips)


CNNS = [cnn(k) for k in (3, 4, 5, 6, 8)]
TRANSFORMERS = [transformer(k) for k in (2, 3, 4, 5, 6)]
TRAIN = CNNS[:3] + TRANSFORMERS[:3]
FAST: dict[str, Any] = {"dim": 16, "epochs": 30, "seed": 0}


@pytest.fixture(scope="module")
def fitted() -> Graph2Vec:
    return Graph2Vec(**FAST).fit(TRAIN)


def cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --------------------------------------------------------------------------- wl_words


def test_wl_words_layout() -> None:
    g = chain(["convolution", "relu", "add"], skips=[(0, 2)])
    words = wl_words(g, iterations=2)
    assert len(words) == 2 * 3 * g.number_of_nodes()
    assert all(w.startswith(("o:", "i:")) for w in words)
    # node 0 first: depth-0 op names (both directions), then the hashed depths
    assert words[:2] == ["o:convolution", "i:convolution"]
    assert words[6:8] == ["o:relu", "i:relu"]
    # a source node: out-subtree differs from in-subtree at depth 1
    assert words[2][2:] != words[3][2:]
    depth0 = ["o:convolution", "i:convolution", "o:relu", "i:relu", "o:add", "i:add"]
    assert wl_words(g, iterations=0) == depth0


def test_wl_words_deterministic_and_order_independent() -> None:
    g = chain(["addmm", "_softmax", "bmm", "add"], skips=[(0, 3)])
    shuffled = nx.DiGraph()
    for n in (3, 1, 0, 2):
        shuffled.add_node(n, **g.nodes[n])
    shuffled.add_edges_from(reversed(list(g.edges)))
    assert wl_words(g) == wl_words(g) == wl_words(shuffled)


def test_wl_words_direction_matters() -> None:
    a = chain(["convolution", "relu"])
    b = chain(["relu", "convolution"])
    assert sorted(wl_words(a, iterations=0)) == sorted(wl_words(b, iterations=0))
    assert sorted(wl_words(a)) != sorted(wl_words(b))


def test_wl_words_edge_cases() -> None:
    assert wl_words(nx.DiGraph()) == []
    g = nx.DiGraph()
    g.add_node("x")
    with pytest.raises(ValueError, match="'op'"):
        wl_words(g)
    with pytest.raises(ValueError, match="iterations"):
        wl_words(chain(["relu"]), iterations=-1)
    mixed = nx.DiGraph()
    mixed.add_node(1, op="relu")
    mixed.add_node("a", op="add")
    assert len(wl_words(mixed)) == 12  # unorderable node ids still get a stable order


# --------------------------------------------------------------------------- fit / transform


def test_fit_transform_shape(fitted: Graph2Vec) -> None:
    x = fitted.transform(CNNS + TRANSFORMERS)
    assert x.shape == (10, 16)
    assert x.dtype == np.float32
    assert np.isfinite(x).all()
    assert fitted.embeddings_.shape == (len(TRAIN), 16)
    assert fitted.transform([]).shape == (0, 16)


def test_fit_returns_self_and_keeps_params() -> None:
    model = Graph2Vec(dim=8, epochs=3, infer_epochs=2)
    assert model.fit(TRAIN[:2]) is model
    assert (model.dim, model.epochs, model.infer_epochs) == (8, 3, 2)
    assert model.transform(TRAIN[:1]).shape == (1, 8)


def test_determinism(fitted: Graph2Vec) -> None:
    graphs = [CNNS[4], TRANSFORMERS[4], CNNS[0]]
    first = fitted.transform(graphs)
    assert np.array_equal(first, fitted.transform(graphs))
    # a graph's vector does not depend on what was transformed before it
    assert np.array_equal(first[1], fitted.transform([TRANSFORMERS[4]])[0])
    again = Graph2Vec(**FAST).fit(TRAIN)
    assert np.array_equal(again.embeddings_, fitted.embeddings_)
    assert np.array_equal(again.transform(graphs), first)


def test_families_embed_closer(fitted: Graph2Vec) -> None:
    x = fitted.transform(CNNS + TRANSFORMERS)
    sims = np.array([[cosine(a, b) for b in x] for a in x])
    fam = np.array([0] * len(CNNS) + [1] * len(TRANSFORMERS))
    same = fam[:, None] == fam[None, :]
    off_diag = ~np.eye(len(x), dtype=bool)
    within = sims[same & off_diag].mean()
    across = sims[~same].mean()
    assert within > across + 0.2, (within, across)
    # and each unseen graph (indices 3, 4 of each family) is nearest to its own family's mean
    for i in (3, 4, 8, 9):
        own = sims[i, same[i] & off_diag[i]].mean()
        other = sims[i, ~same[i]].mean()
        assert own > other, (i, own, other)


def test_oov_graph_and_empty_graph(fitted: Graph2Vec) -> None:
    novel = chain(["mystery_op", "other_op", "mystery_op"])
    assert fitted.oov_fraction(novel) == 1.0
    x = fitted.transform([novel, novel, nx.DiGraph()])
    assert np.array_equal(x, np.zeros((3, 16), dtype=np.float32))
    assert fitted.oov_fraction(nx.DiGraph()) == 0.0
    assert 0.0 <= fitted.oov_fraction(CNNS[4]) < 0.5
    assert fitted.oov_fraction(CNNS[0]) == 0.0  # a training graph


def test_fit_with_an_empty_graph() -> None:
    model = Graph2Vec(dim=4, epochs=2).fit([nx.DiGraph(), CNNS[0]])
    assert model.embeddings_.shape == (2, 4)
    assert model.transform([nx.DiGraph()]).shape == (1, 4)


def test_errors() -> None:
    model = Graph2Vec()
    with pytest.raises(NotFittedError):
        model.transform(TRAIN)
    with pytest.raises(NotFittedError):
        model.oov_fraction(TRAIN[0])
    with pytest.raises(NotFittedError):
        model.save("unused")
    with pytest.raises(ValueError, match="at least one graph"):
        model.fit([])
    with pytest.raises(ValueError, match="no WL word"):
        Graph2Vec(min_count=10_000).fit(TRAIN[:1])
    with pytest.raises(ValueError, match="dim"):
        Graph2Vec(dim=0).fit(TRAIN)


def test_long_documents_are_chunked(monkeypatch: pytest.MonkeyPatch, fitted: Graph2Vec) -> None:
    """gensim drops words past its 10,000-word limit; we feed long documents in chunks."""
    monkeypatch.setattr(g2v, "_GENSIM_MAX_WORDS", 7)
    lengths: list[int] = []
    real = g2v.train_document_dbow

    def spy(model: Any, words: list[str], *args: Any, **kwargs: Any) -> Any:
        lengths.append(len(words))
        return real(model, words, *args, **kwargs)

    monkeypatch.setattr(g2v, "train_document_dbow", spy)
    graph = TRANSFORMERS[0]
    known = [w for w in wl_words(graph) if w in fitted.model_.wv.key_to_index]
    fitted.transform([graph])
    assert max(lengths) <= 7
    assert sum(lengths) == len(known) * FAST["epochs"]
    # training splits long documents too, but keeps one vector per graph
    model = Graph2Vec(dim=4, epochs=2).fit(TRAIN[:3])
    assert model.embeddings_.shape == (3, 4)


# --------------------------------------------------------------------------- persistence


def test_save_load_round_trip(fitted: Graph2Vec, tmp_path: Path) -> None:
    graphs = [CNNS[4], TRANSFORMERS[4], CNNS[1], chain(["mystery_op"])]
    before = fitted.transform(graphs)
    fitted.save(tmp_path / "model")
    files = sorted(p.name for p in (tmp_path / "model").iterdir())
    assert files == ["graph2vec.json", "graph2vec.npz"]
    assert not list(tmp_path.rglob("*.pkl")) and not list(tmp_path.rglob("*.pickle"))

    meta = json.loads((tmp_path / "model" / "graph2vec.json").read_text())
    assert meta["params"] == {
        "dim": 16,
        "iterations": 2,
        "epochs": 30,
        "min_count": 1,
        "seed": 0,
        "infer_epochs": None,
    }
    assert meta["vocabulary"] == list(fitted.model_.wv.index_to_key)
    with np.load(tmp_path / "model" / "graph2vec.npz", allow_pickle=False) as arrays:
        for key in arrays.files:  # object arrays would raise here
            assert arrays[key].dtype != object

    loaded = Graph2Vec.load(tmp_path / "model")
    assert isinstance(loaded, Graph2Vec)
    assert list(loaded.model_.wv.index_to_key) == list(fitted.model_.wv.index_to_key)
    assert np.array_equal(loaded.model_.cum_table, fitted.model_.cum_table)
    assert np.array_equal(loaded.model_.syn1neg, fitted.model_.syn1neg)
    assert np.array_equal(loaded.embeddings_, fitted.embeddings_)
    after = loaded.transform(graphs)
    assert np.array_equal(after, before)
    assert loaded.oov_fraction(CNNS[4]) == fitted.oov_fraction(CNNS[4])


def test_round_trip_with_tied_counts(tmp_path: Path) -> None:
    """Many words share a count; the rebuilt vocabulary must keep the saved order."""
    model = Graph2Vec(dim=4, epochs=2, iterations=0).fit([chain([f"op{i}" for i in range(40)])])
    model.save(tmp_path)
    loaded = Graph2Vec.load(str(tmp_path))
    assert list(loaded.model_.wv.index_to_key) == list(model.model_.wv.index_to_key)
    graph = chain(["op3", "op7", "op1"])
    assert np.array_equal(loaded.transform([graph]), model.transform([graph]))


def test_load_rejects_other_formats(tmp_path: Path) -> None:
    (tmp_path / "graph2vec.json").write_text(json.dumps({"format": "x", "format_version": 1}))
    with pytest.raises(ValueError, match="not a"):
        Graph2Vec.load(tmp_path)


_CHILD = """
import sys, types
import numpy as np, networkx as nx
pkg = types.ModuleType("costaware")  # skip costaware/__init__ (imports torch): faster start
pkg.__path__ = [sys.argv[1]]
sys.modules["costaware"] = pkg
from costaware.core.graph2vec import Graph2Vec
specs = __import__("json").load(open(sys.argv[3]))
graphs = []
for ops, edges in specs:
    g = nx.DiGraph()
    g.add_nodes_from((i, {"op": op}) for i, op in enumerate(ops))
    g.add_edges_from(map(tuple, edges))
    graphs.append(g)
np.save(sys.argv[4], Graph2Vec.load(sys.argv[2]).transform(graphs))
"""


def test_vectors_identical_in_another_process(fitted: Graph2Vec, tmp_path: Path) -> None:
    """Inference must not depend on Python's per-process string hashing (PYTHONHASHSEED)."""
    graphs = [CNNS[4], TRANSFORMERS[3]]
    fitted.save(tmp_path / "model")
    specs = [([g.nodes[n]["op"] for n in sorted(g)], sorted(g.edges)) for g in graphs]
    (tmp_path / "graphs.json").write_text(json.dumps(specs))
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(SRC_DIR),
            str(tmp_path / "model"),
            str(tmp_path / "graphs.json"),
            str(tmp_path / "out.npy"),
        ],
        check=True,
        env=env,
        timeout=120,
    )
    child = np.load(tmp_path / "out.npy", allow_pickle=False)
    assert np.array_equal(child, fitted.transform(graphs))
