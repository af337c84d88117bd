"""graph2vec: whole-graph embeddings of operator graphs.

graph2vec (Narayanan et al., 2017, https://arxiv.org/abs/1707.05005) treats every graph as a
*document* whose *words* are the Weisfeiler-Lehman (WL) rooted-subtree labels of its nodes, and
learns one vector per document with PV-DBOW (gensim's ``Doc2Vec(dm=0)``).  A graph that was not
in the training set is embedded inductively: its document vector is fitted against the frozen
output weights (what ``Doc2Vec.infer_vector`` does).

Our graphs are ``networkx.DiGraph`` s of aten operators (node attribute ``op``), usually DAGs.  WL
on a DAG only looks one way, so :func:`wl_words` runs it on the graph (out-neighbourhoods, words
prefixed ``"o:"``) and on the reversed graph (in-neighbourhoods, prefixed ``"i:"``).

Differences from calling ``Doc2Vec.infer_vector`` directly
---------------------------------------------------------
:meth:`Graph2Vec.transform` runs the same PV-DBOW inference loop as ``infer_vector`` (same
learning-rate schedule, same Cython training routine) but

* seeds the starting vector from ``zlib.crc32`` of the words and :attr:`Graph2Vec.seed`;
  ``infer_vector`` seeds it with Python's ``hash()``, which changes between processes
  (``PYTHONHASHSEED``), so a saved model would embed the same graph differently after a
  restart;
* reseeds the negative-sampling random stream before every graph, so the vector of a graph does
  not depend on what was transformed before it;
* feeds documents longer than gensim's 10,000-word limit in chunks (gensim silently truncates
  them, which would drop most of a 5,000-node graph); training does the same by splitting a long
  document into several documents with the same tag;
* returns zeros for a graph none of whose words are in the vocabulary.

Persistence uses no pickle: a JSON file with the hyperparameters and the vocabulary, and an
``.npz`` with the arrays (loaded with ``allow_pickle=False``).

Example
-------
>>> import networkx as nx
>>> def chain(ops: list[str]) -> nx.DiGraph:
...     g = nx.DiGraph()
...     for i, op in enumerate(ops):
...         g.add_node(i, op=op)
...         if i:
...             g.add_edge(i - 1, i)
...     return g
>>> graphs = [chain(["convolution", "native_batch_norm", "relu"] * k) for k in (2, 3, 4)]
>>> model = Graph2Vec(dim=8, epochs=20).fit(graphs)
>>> model.transform(graphs).shape
(3, 8)
>>> model.oov_fraction(chain(["addmm", "softmax"]))
1.0
"""

from __future__ import annotations

import json
import os
import warnings
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import networkx as nx
import numpy as np
import numpy.typing as npt
from gensim.models.doc2vec import Doc2Vec, TaggedDocument
from gensim.models.doc2vec_inner import train_document_dbow

from costaware.errors import NotFittedError

__all__ = ["Graph2Vec", "wl_words"]

FORMAT: Final = "costaware.graph2vec"
FORMAT_VERSION: Final = 1
JSON_NAME: Final = "graph2vec.json"
ARRAYS_NAME: Final = "graph2vec.npz"

# gensim's Cython routines silently stop reading a document after this many words
# (MAX_DOCUMENT_LEN in doc2vec_inner.pyx).
_GENSIM_MAX_WORDS: Final = 10_000
_NODE_ATTR: Final = "op"


def _sorted_nodes(graph: nx.DiGraph) -> list[Any]:
    nodes = list(graph.nodes)
    try:
        return sorted(nodes)
    except TypeError:  # mixed, unorderable node ids
        return sorted(nodes, key=lambda n: (type(n).__name__, repr(n)))


def _wl_labels(graph: nx.DiGraph, node_attr: str, iterations: int) -> dict[Any, list[str]]:
    """WL labels of depths 1..iterations for each node (following out-edges)."""
    with warnings.catch_warnings():
        # networkx warns on every directed call that its directed hashes changed in 3.5.
        warnings.filterwarnings("ignore", message="The hashes produced for", category=UserWarning)
        hashes: dict[Any, list[str]] = nx.weisfeiler_lehman_subgraph_hashes(
            graph, node_attr=node_attr, iterations=iterations, include_initial_labels=True
        )
    # Depth 0 is networkx's hash of the label; the callers use the readable label instead.
    return {node: labels[1:] for node, labels in hashes.items()}


def wl_words(graph: nx.DiGraph, node_attr: str = "op", iterations: int = 2) -> list[str]:
    """Return the graph2vec "document" of ``graph``: its WL rooted-subtree labels.

    For every node (in sorted node-id order) and every depth ``d = 0..iterations`` two words are
    emitted: ``"o:<label>"`` for the subtree that follows out-edges and ``"i:<label>"`` for the one
    that follows in-edges (WL on ``graph.reverse()``).  Depth 0 is the node's own attribute
    (e.g. the op name, ``"o:relu"``); deeper labels are networkx's
    :func:`~networkx.weisfeiler_lehman_subgraph_hashes` digests.  Edge attributes are ignored.

    Args:
        graph: a directed graph whose nodes all carry ``node_attr``.
        node_attr: the node attribute to label with (converted with ``str``).
        iterations: WL depth ``h`` (0 gives the attributes only).

    Returns:
        ``2 * (iterations + 1) * graph.number_of_nodes()`` words; ``[]`` for an empty graph.

    Raises:
        ValueError: ``iterations`` is negative or a node lacks ``node_attr``.

    Example:
        >>> import networkx as nx
        >>> g = nx.DiGraph()
        >>> g.add_node(0, op="convolution")
        >>> g.add_node(1, op="relu")
        >>> g.add_edge(0, 1)
        >>> words = wl_words(g, iterations=1)
        >>> len(words), words[:2]
        (8, ['o:convolution', 'i:convolution'])
    """
    if iterations < 0:
        raise ValueError(f"iterations must be >= 0, got {iterations}")
    if graph.number_of_nodes() == 0:
        return []
    for node, data in graph.nodes(data=True):
        if node_attr not in data:
            raise ValueError(f"node {node!r} has no {node_attr!r} attribute")
    nodes = _sorted_nodes(graph)
    out_labels: dict[Any, list[str]] = {}
    in_labels: dict[Any, list[str]] = {}
    if iterations > 0:
        out_labels = _wl_labels(graph, node_attr, iterations)
        in_labels = _wl_labels(graph.reverse(copy=False), node_attr, iterations)
    words: list[str] = []
    for node in nodes:
        label = str(graph.nodes[node][node_attr])
        words.append("o:" + label)
        words.append("i:" + label)
        for depth in range(iterations):
            words.append("o:" + out_labels[node][depth])
            words.append("i:" + in_labels[node][depth])
    return words


def _chunks(words: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(words), _GENSIM_MAX_WORDS):
        yield words[start : start + _GENSIM_MAX_WORDS]


class Graph2Vec:
    """graph2vec embedder for operator DiGraphs (PV-DBOW over WL subtree words).

    The constructor only stores hyperparameters (scikit-learn style); :meth:`fit` learns the
    vocabulary and the output weights.  Learned state lives in attributes ending in ``_``:

    * ``model_``: the gensim ``Doc2Vec`` model;
    * ``embeddings_``: ``(n_train, dim)`` float32 vectors learned for the training graphs.

    :meth:`transform` mutates ``model_.random``; do not call it from several threads at once.

    Args:
        dim: embedding size.
        iterations: WL depth (see :func:`wl_words`).
        epochs: training epochs.
        min_count: words seen fewer times in the training graphs are dropped.
        seed: seed of every random choice (initial weights, negative sampling, inference).
        infer_epochs: inference epochs in :meth:`transform` (default: ``epochs``).

    Example:
        >>> import networkx as nx
        >>> g = nx.DiGraph()
        >>> g.add_nodes_from([(0, {"op": "addmm"}), (1, {"op": "softmax"}), (2, {"op": "bmm"})])
        >>> g.add_edges_from([(0, 1), (1, 2)])
        >>> emb = Graph2Vec(dim=4, epochs=5).fit([g, g.reverse()])
        >>> vec = emb.transform([g])
        >>> vec.shape, vec.dtype.name
        ((1, 4), 'float32')
        >>> bool((emb.transform([g]) == vec).all())
        True
    """

    def __init__(
        self,
        dim: int = 16,
        iterations: int = 2,
        epochs: int = 50,
        min_count: int = 1,
        seed: int = 0,
        infer_epochs: int | None = None,
    ) -> None:
        self.dim = dim
        self.iterations = iterations
        self.epochs = epochs
        self.min_count = min_count
        self.seed = seed
        self.infer_epochs = infer_epochs

    def __repr__(self) -> str:
        return (
            f"Graph2Vec(dim={self.dim}, iterations={self.iterations}, epochs={self.epochs}, "
            f"min_count={self.min_count}, seed={self.seed}, infer_epochs={self.infer_epochs})"
        )

    # ------------------------------------------------------------------ helpers

    def _check_params(self) -> None:
        for name in ("dim", "epochs", "min_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.iterations, int) or self.iterations < 0:
            raise ValueError(f"iterations must be an int >= 0, got {self.iterations!r}")
        if self.infer_epochs is not None and (
            not isinstance(self.infer_epochs, int) or self.infer_epochs < 1
        ):
            raise ValueError(
                f"infer_epochs must be a positive int or None, got {self.infer_epochs!r}"
            )

    def _new_model(self) -> Doc2Vec:
        return Doc2Vec(
            dm=0,
            vector_size=self.dim,
            window=0,
            min_count=self.min_count,
            epochs=self.epochs,
            seed=self.seed,
            workers=1,
            negative=5,
            hs=0,
            sample=0,
        )

    def _model(self) -> Doc2Vec:
        model: Doc2Vec | None = getattr(self, "model_", None)
        if model is None:
            raise NotFittedError("this Graph2Vec is not fitted yet; call fit() or load() first")
        return model

    def _words(self, graph: nx.DiGraph) -> list[str]:
        return wl_words(graph, node_attr=_NODE_ATTR, iterations=self.iterations)

    def _infer(self, model: Doc2Vec, words: list[str]) -> npt.NDArray[np.float32]:
        """PV-DBOW inference of one document (``Doc2Vec.infer_vector``, made deterministic)."""
        known = [w for w in words if w in model.wv.key_to_index]
        if not known:
            return np.zeros(self.dim, dtype=np.float32)
        crc = zlib.crc32("\n".join(known).encode("utf-8"))
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, crc])
        vector = ((rng.random(self.dim, dtype=np.float32) - 0.5) / self.dim).astype(np.float32)
        doctag_vectors = vector.reshape(1, self.dim)
        doctags_lockf = np.ones(1, dtype=np.float32)
        work = np.zeros(model.layer1_size, dtype=np.float32)
        # Negative samples are drawn from a stream seeded from model.random on each call.
        model.random = np.random.RandomState(self.seed)

        epochs = self.infer_epochs or self.epochs
        alpha = float(model.alpha)
        alpha_delta = (alpha - float(model.min_alpha)) / max(epochs - 1, 1)
        for _ in range(epochs):
            for chunk in _chunks(known):
                train_document_dbow(
                    model,
                    chunk,
                    [0],
                    alpha,
                    work,
                    learn_words=False,
                    learn_hidden=False,
                    doctag_vectors=doctag_vectors,
                    doctags_lockf=doctags_lockf,
                )
            alpha -= alpha_delta
        result: npt.NDArray[np.float32] = doctag_vectors[0].copy()
        return result

    # ------------------------------------------------------------------ API

    def fit(self, graphs: Sequence[nx.DiGraph]) -> Graph2Vec:
        """Learn the vocabulary and the PV-DBOW weights from ``graphs``.

        Args:
            graphs: training graphs (their nodes carry ``op``).

        Returns:
            ``self``.

        Raises:
            ValueError: ``graphs`` is empty, a hyperparameter is invalid, or no word occurs at
                least ``min_count`` times.

        Example:
            >>> import networkx as nx
            >>> g = nx.DiGraph([(0, 1)])
            >>> nx.set_node_attributes(g, {0: "mm", 1: "relu"}, "op")
            >>> Graph2Vec(dim=4, epochs=2).fit([g]).embeddings_.shape
            (1, 4)
        """
        self._check_params()
        if len(graphs) == 0:
            raise ValueError("fit() needs at least one graph")
        corpus: list[TaggedDocument] = []
        for tag, graph in enumerate(graphs):
            words = self._words(graph)
            # An empty graph still gets its tag (an untrained vector) so tags stay 0..n-1.
            corpus.extend(TaggedDocument(chunk, [tag]) for chunk in (list(_chunks(words)) or [[]]))

        model = self._new_model()
        model.build_vocab(corpus)
        if len(model.wv) == 0:
            raise ValueError(
                f"no WL word occurs at least min_count={self.min_count} times in the "
                f"{len(graphs)} training graph(s)"
            )
        model.train(corpus, total_examples=len(corpus), epochs=self.epochs)
        self.model_ = model
        self.embeddings_: npt.NDArray[np.float32] = np.array(
            model.dv.vectors[: len(graphs)], dtype=np.float32
        )
        return self

    def transform(self, graphs: Sequence[nx.DiGraph]) -> npt.NDArray[np.float32]:
        """Embed ``graphs`` inductively (training graphs are re-inferred too).

        The result depends only on the graph, the fitted model and the hyperparameters: the
        same graph always gives a bit-identical vector, in any process.  Words not in the
        vocabulary are ignored; a graph with no known word (or no node) embeds to zeros.

        Returns:
            ``(len(graphs), dim)`` float32 array.

        Raises:
            NotFittedError: neither :meth:`fit` nor :meth:`load` was called.
        """
        model = self._model()
        out = np.zeros((len(graphs), self.dim), dtype=np.float32)
        for row, graph in enumerate(graphs):
            out[row] = self._infer(model, self._words(graph))
        return out

    def oov_fraction(self, graph: nx.DiGraph) -> float:
        """Fraction of ``graph``'s WL words that are not in the vocabulary (0.0 if it has none).

        Raises:
            NotFittedError: neither :meth:`fit` nor :meth:`load` was called.
        """
        vocab = self._model().wv.key_to_index
        words = self._words(graph)
        if not words:
            return 0.0
        return sum(w not in vocab for w in words) / len(words)

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write the fitted model to ``directory`` (created if needed) without pickle.

        Files: ``graph2vec.json`` (format, hyperparameters, vocabulary in index order with
        counts) and ``graph2vec.npz`` (``word_vectors``, ``syn1neg``, ``doc_vectors``,
        ``cum_table``).

        Raises:
            NotFittedError: the model is not fitted.
        """
        model = self._model()
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        words = list(model.wv.index_to_key)
        counts = [int(model.wv.get_vecattr(w, "count")) for w in words]
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "params": {
                "dim": self.dim,
                "iterations": self.iterations,
                "epochs": self.epochs,
                "min_count": self.min_count,
                "seed": self.seed,
                "infer_epochs": self.infer_epochs,
            },
            "node_attr": _NODE_ATTR,
            "alpha": float(model.alpha),
            "min_alpha": float(model.min_alpha),
            "n_train_graphs": int(self.embeddings_.shape[0]),
            "vocabulary": words,
            "counts": counts,
        }
        (path / JSON_NAME).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        np.savez(
            path / ARRAYS_NAME,
            word_vectors=np.asarray(model.wv.vectors, dtype=np.float32),
            syn1neg=np.asarray(model.syn1neg, dtype=np.float32),
            doc_vectors=self.embeddings_,
            cum_table=np.asarray(model.cum_table),
        )

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Graph2Vec:
        """Load a model written by :meth:`save` (no pickle involved).

        Raises:
            ValueError: the files are not a supported graph2vec save or are inconsistent.
            FileNotFoundError: a file is missing.
        """
        path = Path(directory)
        meta = json.loads((path / JSON_NAME).read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{path / JSON_NAME} is not a {FORMAT} v{FORMAT_VERSION} file "
                f"(format={meta.get('format')!r}, version={meta.get('format_version')!r})"
            )
        self = cls(**meta["params"])
        self._check_params()
        words: list[str] = meta["vocabulary"]
        counts: list[int] = meta["counts"]
        if len(words) != len(counts) or len(set(words)) != len(words) or not words:
            raise ValueError(f"{path / JSON_NAME}: malformed vocabulary")
        with np.load(path / ARRAYS_NAME, allow_pickle=False) as arrays:
            word_vectors = np.array(arrays["word_vectors"], dtype=np.float32)
            syn1neg = np.array(arrays["syn1neg"], dtype=np.float32)
            doc_vectors = np.array(arrays["doc_vectors"], dtype=np.float32)
            cum_table = np.array(arrays["cum_table"])
        expected = (len(words), self.dim)
        if word_vectors.shape != expected or syn1neg.shape != expected:
            raise ValueError(
                f"{path / ARRAYS_NAME}: arrays have shapes {word_vectors.shape}, "
                f"{syn1neg.shape}; expected {expected}"
            )

        model = self._new_model()
        model.alpha = float(meta["alpha"])
        model.min_alpha = float(meta["min_alpha"])
        # Unsorted build keeps the saved index order (dicts keep insertion order); re-sorting
        # would reverse ties (KeyedVectors.sort_by_descending_frequency).
        model.sorted_vocab = 0
        model.build_vocab_from_freq(dict(zip(words, counts, strict=True)))
        model.sorted_vocab = 1
        if list(model.wv.index_to_key) != words:
            raise ValueError(f"{path}: rebuilt vocabulary differs from the saved one")
        # build_vocab_from_freq rebuilds cum_table from the counts; it must match the saved one.
        if not np.array_equal(np.asarray(model.cum_table), cum_table):
            raise ValueError(f"{path}: rebuilt negative-sampling table differs from the saved one")
        model.wv.vectors = word_vectors
        model.syn1neg = syn1neg
        self.model_ = model
        self.embeddings_ = doc_vectors
        return self
