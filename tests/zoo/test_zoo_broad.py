"""The broad families of the zoo (issue 42, item 2) and the corpora that draw them.

Each family builds on the meta device at its reference size (parameter counts of the
published models where the topology is the same), trains a step on the CPU at a toy size,
dry-runs as a CPU and as a GPU runs it, and is drawn by the "gpu-broad" and "cpu-broad"
corpora, which the GPU window's ``broad`` step collects; the original corpora are left as
they were measured.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import costaware as ca
from costaware import zoo
from costaware.measure.collect import read_rows
from costaware.measure.corpus import Config, corpus, full_corpus, recommended_shards

IMG = (2, 3, 32, 32)

#: family -> (toy factory, input shape, output shape), one or more per family
TINY: dict[str, list[tuple[Callable[[], nn.Module], tuple[int, ...], tuple[int, ...]]]] = {
    "convnext": [(lambda: zoo.convnext((1, 1, 1, 1), (8, 16, 24, 32), 5), IMG, (2, 5))],
    "efficientnet": [
        (lambda: zoo.efficientnet(0.25, 0.34, 5), IMG, (2, 5)),
        (lambda: zoo.efficientnet(0.25, 0.34, 5, se_ratio=0, activation="relu"), IMG, (2, 5)),
    ],
    "swin": [(lambda: zoo.swin(32, 2, 8, (2, 2, 2), (2, 2, 4), 4, 5), IMG, (2, 5))],
    "mixer": [
        (lambda: zoo.mlp_mixer(32, 8, 16, 2, 8, 32, 5), IMG, (2, 5)),
        (lambda: zoo.poolformer((1, 1), (8, 16), 5), IMG, (2, 5)),
    ],
    "llama": [(lambda: zoo.llama(50, 32, 2, 4, 2), (2, 10), (2, 10, 50))],
    "t5": [(lambda: zoo.t5(50, 32, 2, 4, 64), (2, 10), (2, 10, 50))],
    "inception": [(lambda: zoo.inception(0.1, 1, 5), IMG, (2, 5))],
    "resnext": [
        (lambda: zoo.resnext(50, 4, 2, 5, base=8), IMG, (2, 5)),
        (lambda: zoo.regnet((1, 1), (16, 32), 8, 0.25, 5), IMG, (2, 5)),
    ],
    "rnn_lm": [(lambda: zoo.rnn("lstm", 50, 8, 16, 3, dropout=0.5), (2, 7), (2, 7, 50))],
}


def _input(shape: tuple[int, ...]) -> Tensor:
    return torch.randint(0, 50, shape) if len(shape) == 2 else torch.randn(shape)


def test_tiny_configs_cover_every_broad_family() -> None:
    assert set(TINY) == set(zoo.BROAD_FAMILIES)
    assert not set(zoo.BROAD_FAMILIES) & set(zoo.FAMILIES)


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (zoo.convnext, 28_589_128),  # ConvNeXt-T
        (zoo.efficientnet, 5_288_548),  # EfficientNet-B0
        (zoo.mlp_mixer, 18_528_264),  # Mixer-S/16
        (zoo.poolformer, 11_915_176),  # PoolFormer-S12
        (zoo.resnext, 25_028_904),  # ResNeXt-50 32x4d
        (lambda: zoo.resnext(50, 1, 128), 68_883_240),  # Wide ResNet-50-2
        (zoo.regnet, 7_259_656),  # RegNetX-800MF
    ],
)
def test_reference_parameter_counts(factory: Callable[[], nn.Module], expected: int) -> None:
    with torch.device("meta"):
        model = factory()
    assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize("family", sorted(TINY))
def test_tiny_training_step_on_cpu(family: str) -> None:
    torch.manual_seed(0)
    for factory, in_shape, out_shape in TINY[family]:
        model = factory()
        out = model(_input(in_shape))
        assert tuple(out.shape) == out_shape
        assert torch.isfinite(out).all()
        out.float().square().mean().backward()
        for name, p in model.named_parameters():
            assert p.grad is not None, f"{family}: {name} got no gradient"
            assert torch.isfinite(p.grad).all(), f"{family}: {name}"


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="does not split into"):
        zoo.swin(image_size=100)
    with pytest.raises(ValueError, match="kv_heads"):
        zoo.llama(heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="depth must be one of"):
        zoo.resnext(depth=42)
    with pytest.raises(ValueError, match="groups of 16"):
        zoo.regnet(widths=(24, 48, 96, 200))
    with pytest.raises(ValueError, match="activation"):
        zoo.efficientnet(activation="gelu")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the corpora
@pytest.mark.parametrize("kind", ["gpu-broad", "cpu-broad"])
def test_broad_corpus_draws_every_broad_family(kind: str) -> None:
    configs = full_corpus(kind)
    assert [c.id for c in configs] == [c.id for c in full_corpus(kind)]
    assert {c.family for c in configs} == set(zoo.BROAD_FAMILIES)
    assert {c.corpus for c in configs} == {kind}
    assert len({c.id for c in configs}) == len(configs) > 150
    if kind == "cpu-broad":
        assert max(c.est_seconds for c in configs) < 5
    shards = recommended_shards(kind)
    ids = [c.id for s in range(shards) for c in corpus(kind, s, shards)]
    assert sorted(ids) == sorted(c.id for c in configs)


def test_the_original_corpora_are_unchanged() -> None:
    """The broad families are drawn apart: the measured corpora keep their configurations
    and order (digests of seed 0's ids, as they were before the broad families)."""

    def digest(kind: str) -> str:
        return hashlib.sha1("".join(c.id for c in full_corpus(kind)).encode()).hexdigest()[:12]

    assert digest("gpu") == "c14c8f2ae345"
    assert digest("cpu") == "1f5840e48374"


@pytest.mark.parametrize("family", sorted(TINY))
def test_each_broad_family_dry_runs_at_its_smallest_size(family: str) -> None:
    """The smallest cpu-broad configuration of each family, rebuilt from its JSON record,
    dry-runs as a CPU runs it and as a GPU runs it (fused attention, RMSNorm, RNNs)."""
    config = min(
        (c for c in full_corpus("cpu-broad") if c.family == family),
        key=lambda c: (c.fwd_flops * c.batch_size, c.id),
    )
    spec = Config.from_dict(json.loads(json.dumps(config.to_dict()))).to_spec()
    for attention in ("native", "fused"):
        tr = ca.dry_run(spec, timeout=None, attention=attention)
        assert tr.flops_forward > 0 and tr.flops_backward > 0
        assert tr.peak_live > tr.param_bytes > 0


# --------------------------------------------------------------------------- the GPU window
WINDOW = Path(__file__).resolve().parents[2] / "data" / "gpu_window.sh"


@pytest.mark.slow
def test_gpu_window_broad_step_collects_the_broad_corpus(tmp_path: Path) -> None:
    (tmp_path / "src").symlink_to(Path(__file__).resolve().parents[2] / "src")
    (tmp_path / "data" / "gpu").mkdir(parents=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        "COSTAWARE_DEVICE": "cpu",
        "COSTAWARE_CORPUS": "cpu",
        "COSTAWARE_SHARDS": "8",
        "COSTAWARE_LIMIT": "1",
    }
    r = subprocess.run(
        ["bash", str(WINDOW), "broad", "0", "0", "3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    rows = list(read_rows(tmp_path / "out" / "cpu-broad-shard0.jsonl.gz"))
    assert [x["id"] for x in rows] == [corpus("cpu-broad", 0, 8)[0].id]
    assert rows[0]["family"] in zoo.BROAD_FAMILIES
