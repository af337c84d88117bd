from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from costaware.cli import main
from tests.test_devices import REQUIRED

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models.py"
TINY = """
from torch import nn

def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

def broken():
    raise RuntimeError("boom")

class NotAFactory:
    pass

VALUE = 3
"""


@pytest.fixture
def factory_file(tmp_path: Path) -> Path:
    f = tmp_path / "tiny_models.py"
    f.write_text(TINY)
    return f


def test_predict_prints_a_table(factory_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "predict",
            f"{factory_file}:mlp",
            "--batch-size",
            "64",
            "--input",
            "32",
            "--classes",
            "10",
            "--optimizer",
            "adamw",
            "--device",
            "H100",
            "--dataset-size",
            "6400",
            "--explain",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "peak memory (reserved)" in out and "epoch time" in out and "H100-SXM" in out
    assert "fits" in out and "based on" in out
    assert "the rest is CUDA context" in " ".join(out.split())  # rich wraps long lines
    # a CPU has no CUDA context to set aside, and the verdict does not mention one
    cpu = ["predict", f"{factory_file}:mlp", "-b", "4", "--input", "32", "--device", "cpu"]
    assert main([*cpu, "--classes", "10"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "usable memory." in out and "CUDA context" not in out
    # the default 1000 classes against the model's 10 outputs: a step that would fail on
    # the device is one clear line, not a prediction
    assert main(cpu) == 2
    err = capsys.readouterr().err
    assert err.startswith("costaware: error: the batch's labels (--classes 1000)")
    assert "cross-entropy over 10 classes" in err and len(err.strip().splitlines()) == 1
    assert "Make the batch fit the model: --classes 10" in err  # the flag, not ImageBatch(...)


def test_predict_json(factory_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "predict",
            f"{factory_file}:mlp",
            "-b",
            "8",
            "--input",
            "32",
            "--classes",
            "10",
            "--device",
            "A100",
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert data["device"] == "A100-80GB" and data["peak_memory_upper"] >= data["peak_memory"] > 0
    assert data["spec"]["batch_size"] == 8


def test_predict_a_trial_cut_at_max_steps(
    factory_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["predict", f"{factory_file}:mlp", "-b", "64", "--input", "32", "--classes", "10"]
    args += ["--device", "H100", "--dataset-size", "6400", "--epochs", "5", "--max-steps", "150"]
    assert main(args) == 0
    assert "trial time (150 steps)" in capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["spec"]["steps_per_epoch"], data["spec"]["trial_steps"]) == (100, 150)
    assert data["trial_time"] == pytest.approx(data["iteration_time"] * 150)
    assert main([*args[:-1], "0"]) == 2
    assert "--max-steps must be a positive integer" in capsys.readouterr().err


def test_predict_one_rank_of_sharded_training(
    factory_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["predict", f"{factory_file}:mlp", "-b", "8", "--input", "32", "--classes", "10"]
    args += ["--device", "A100"]
    args += ["--world-size", "4", "--sharding", "full_shard", "--wrap-policy", "torch.nn:Linear"]
    assert main([*args, "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)["spec"]
    assert (spec["sharding"], spec["world_size"], spec["wrap_policy"]) == (
        "full_shard",
        4,
        ["Linear"],
    )


def test_predict_tokens_with_a_module_path(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "predict",
            "costaware.zoo:gpt",
            "-b",
            "2",
            "--seq-len",
            "16",
            "--vocab",
            "50257",
            "--device",
            "L4",
            "--json",
        ]
    )
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["device"] == "L4"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "-4", "--input", "32"], "--batch-size must be a positive integer"),
        (["--batch-size", "4", "--input", "32", "--optimizer", "lamb"], "unknown optimizer 'lamb'"),
        (["--batch-size", "4", "--input", "32", "--device", "H1000"], "H100-SXM"),
        (["--batch-size", "4", "--input", "3xfoo"], "--input must look like"),
        (["--batch-size", "4"], "give the input"),
        (["--batch-size", "4", "--seq-len", "8"], "--seq-len needs --vocab"),
    ],
)
def test_bad_input_is_one_readable_line(
    factory_file: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    rc = main(["predict", f"{factory_file}:mlp", *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("{f}:nope", "has no attribute"),
        ("{f}:VALUE", "not callable"),
        ("/nonexistent/models.py:mlp", "no such file"),
        ("{f}", "expected MODEL"),
        ("{f}:broken", "boom"),
    ],
)
def test_bad_model_reference(
    factory_file: Path, capsys: pytest.CaptureFixture[str], ref: str, message: str
) -> None:
    rc = main(["predict", ref.format(f=factory_file), "-b", "4", "--input", "32"])
    assert rc == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("source", "said", "line"),
    [
        ("import math\nraise RuntimeError('config missing')\n", "RuntimeError: config missing", 2),
        ("def f(:\n    pass\n", "SyntaxError: invalid syntax", 1),
        ("import math\nfrom torch import nnn\n", "ImportError: cannot import name 'nnn'", 2),
        ("import timmm_not_a_package\n", "ModuleNotFoundError: No module named 'timmm_not_a_package'", 1),
    ],
)
def test_an_error_importing_the_users_module_is_theirs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
    said: str,
    line: int,
) -> None:
    """An exception the user's module raises when imported is reported as that module's,
    with its line: by file path and by module name alike."""
    path = tmp_path / "user_models.py"
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    for ref in (f"{path}:f", "user_models:f"):
        rc = main(["predict", ref, "-b", "4", "--input", "32"])
        err = capsys.readouterr().err
        assert rc == 2
        assert err.count("\n") == 1 and "unexpected" not in err
        assert f"raised {said}" in err
        assert f"user_models.py:{line}" in err and "not costaware's" in err
        assert "frozen" not in err
        assert "pip install" not in err  # nothing of costaware's is missing


def test_a_missing_extra_imported_by_the_users_module_says_what_installs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ModuleNotFoundError for one of costaware's extras, from the user's file, is still
    theirs (with its line), and names the extra; a missing module that MODEL names is a
    usage error of its own."""
    import builtins

    real_import = builtins.__import__

    def no_optuna(name: str, *args: object, **kwargs: object) -> object:
        if name == "optuna":
            raise ModuleNotFoundError("No module named 'optuna'", name="optuna")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    path = tmp_path / "study_models.py"
    path.write_text("import optuna\n")
    monkeypatch.setattr(builtins, "__import__", no_optuna)
    assert main(["predict", f"{path}:f", "-b", "4", "--input", "32"]) == 2
    err = capsys.readouterr().err
    assert "study_models.py:1" in err and "pip install 'costaware[optuna]'" in err
    monkeypatch.undo()
    assert main(["predict", "no_such_pkg_xyz.sub:f", "-b", "4", "--input", "32"]) == 2
    err = capsys.readouterr().err
    assert "cannot import module 'no_such_pkg_xyz.sub'" in err and "pip install" not in err


def test_debug_shows_the_traceback(factory_file: Path) -> None:
    with pytest.raises(Exception, match="batch_size"):
        main(["--debug", "predict", f"{factory_file}:mlp", "-b", "0", "--input", "32"])


def test_devices_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for name in REQUIRED:
        assert name in data
    assert main(["devices"]) == 0
    assert "H200" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("module", "cmd"),
    [("costaware.cli", []), ("costaware.cli", ["predict"]), ("costaware", ["devices"])],
)
def test_help_explains_every_command(module: str, cmd: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, *cmd, "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "usage: costaware" in out
    assert ("predict" in out and "devices" in out) if not cmd else "--json" in out


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "COMMAND" in capsys.readouterr().out


def test_examples_models_file_works(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "predict",
            f"{MODELS}:resnet18",
            "-b",
            "4",
            "--input",
            "3x64x64",
            "--device",
            "T4",
            "--json",
        ]
    )
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["basis"]["params"] > 11_000_000


def test_a_bad_value_is_named_by_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """A spec field's error names the flag that sets it, not the library's keyword."""
    model = "examples/models.py:resnet18"
    for flags, said in (
        (["-b", "0", "--input", "3x8x8"], "--batch-size must be a positive integer, but got --batch-size 0"),
        (["-b", "4", "--input", "3x8x8", "--classes", "0"], "--classes must be a positive integer, but got --classes 0"),
        (["-b", "4", "--input", "3x8x8", "--world-size", "0"], "but got --world-size 0"),
    ):  # fmt: skip
        assert main(["predict", model, *flags]) == 2
        err = capsys.readouterr().err
        assert said in err and "batch_size" not in err and "----" not in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from costaware import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"costaware {__version__} (torch ")


LAB = """
[[devices]]
name = "lab-a40"
memory = "44.4GiB"
bandwidth_gbs = 696
tflops = { fp32 = 37.4, fp16 = 149.7, bf16 = 149.7 }
sm_count = 84
compute_capability = "8.6"
generation = "Ampere"
"""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="TOML needs tomllib")
@pytest.mark.parametrize("command", ["predict", "max-batch-size"])
def test_predict_and_max_batch_size_take_a_device_file(
    command: str, factory_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lab = tmp_path / "lab.toml"
    lab.write_text(LAB)
    args = [command, f"{factory_file}:mlp", "-b", "8", "--input", "32", "--classes", "10"]
    extra = ["--json"] if command == "predict" else ["--json", "--limit", "64"]
    assert main([*args, "-d", "lab-a40", "--device-file", str(lab), *extra]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == "lab-a40"
    # the file's devices are named as compare names them, with suggestions among them
    assert main([*args, "-d", "lab-a4O", "--device-file", str(lab)]) == 2
    err = capsys.readouterr().err
    assert "Did you mean 'lab-a40'" in err and "yours: lab-a40." in err
    assert main([*args, "-d", "lab-a40", "--device-file", str(lab), "--device-file", str(lab)]) == 2
    assert "two devices answer to the name 'laba40'" in capsys.readouterr().err


def test_predict_with_a_typo_suggests_the_alias(
    factory_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["predict", f"{factory_file}:mlp", "-b", "8", "--input", "32", "--classes", "10"]
    assert main([*args, "-d", "H10"]) == 2
    assert "Did you mean 'H100' (the H100-SXM)" in capsys.readouterr().err


def test_fit_given_a_store_url_says_what_it_reads(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "sqlite:///costaware.db", "--out", "m"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("costaware: error: sqlite:///costaware.db is a store's URL, but ")
    assert "reads .jsonl.gz files" in err and "refit_every" in err and "calibrate" in err


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"not gzip\n", "it is not gzip-compressed"),
        (gzip.compress(b"not json\n"), "none of its lines is a JSON row"),
    ],
)
def test_fit_given_a_file_without_rows_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, said: str
) -> None:
    data = tmp_path / "rows.jsonl.gz"
    data.write_bytes(content)
    assert main(["fit", str(data), "--out", str(tmp_path / "m")]) == 2
    assert f"no rows in {data}: {said}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["devices"], ["devices", "--json"], []])
def test_help_and_devices_do_not_import_torch(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from costaware.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines()[-1] == "False"


def test_the_parsers_defaults_are_the_librarys() -> None:
    from costaware.cli._common import _SEARCH_LIMIT
    from costaware.cli.compare import _SORT_KEYS
    from costaware.core.batch_size import DEFAULT_LIMIT
    from costaware.core.compare import SORT_KEYS

    assert _SEARCH_LIMIT == DEFAULT_LIMIT and _SORT_KEYS == SORT_KEYS
