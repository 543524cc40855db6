"""``dlscale export`` and ``dlscale.load_model``: a tiny ERA5 run exported by the command; the export gives the
checkpoint's outputs exactly, through dlscale and through its torch.export program in a Python without dlscale;
a classifier exports too; bad input is one line with exit status 2 and nothing written; a changed or incomplete
export is refused by name."""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from run_configs import tiny_run_config

import dlscale
from dlscale.checkpoint.files import load_checkpoint
from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.errors import ExportError
from dlscale.exported import writer
from dlscale.exported.program import export_program
from dlscale.run.training import train
from dlscale.workloads import get_workload

REPO = Path(__file__).resolve().parents[2]
ERA5_CONFIG = REPO / "configs" / "vit_era5.yaml"
MNIST_CONFIG = REPO / "configs" / "cnn_mnist.yaml"
# One epoch of 2 steps: the export, not the training, is under test.
SHORT = ("data.limit_nsamples=8", "data.limit_nsamples_val=4", "train.num_epochs=1")


@pytest.fixture(scope="module")
def era5_run(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny ERA5 run (ckpt_latest.pt and ckpt_best.pt)."""
    expdir = tmp_path_factory.mktemp("runs")
    assert train(tiny_run_config(ERA5_CONFIG, tiny_era5, expdir, *SHORT)) == 0
    return expdir / "tiny" / "00"


@pytest.fixture(scope="module")
def era5_export(era5_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run exported by the command (its latest checkpoint)."""
    out = tmp_path_factory.mktemp("exports") / "tiny"
    assert main(["export", str(era5_run), "--out", str(out)]) == 0
    return out


def checkpoint_model(checkpoint: Path) -> tuple[torch.nn.Module, dict]:
    """The checkpoint's model, built as docs/after-training.md shows (no export involved)."""
    payload = load_checkpoint(checkpoint)
    cfg = load_run_config(checkpoint.parents[1] / "config.yaml", payload["meta"]["config_name"])
    model = get_workload(cfg.workload).build_model(cfg.model, cfg.data)
    model.load_state_dict(payload["model"])
    return model.eval(), payload


def valid_batch(run: Path, count: int, normalize: bool = True) -> torch.Tensor:
    cfg = load_run_config(run / "config.yaml", "tiny")
    dataset = ERA5Dataset(cfg.data, "valid", normalize=normalize)
    return torch.stack([dataset[i][0] for i in range(count)])


def test_load_model_gives_the_checkpoints_outputs_exactly(era5_run, era5_export, tiny_era5):
    model, payload = checkpoint_model(era5_run / "checkpoints" / "ckpt_latest.pt")
    exported = dlscale.load_model(era5_export)
    assert not exported.model.training and exported.workload == "era5_vit"
    inputs = valid_batch(era5_run, 3)
    with torch.no_grad():
        assert torch.equal(exported.model(inputs), model(inputs))
    # The raw fields normalize to the training samples bit for bit, with the stats of the data's own files.
    raw = valid_batch(era5_run, 3, normalize=False)
    assert torch.equal(exported.normalize(raw), inputs)
    means = np.load(tiny_era5 / "stats" / "global_means.npy")[0, :20, 0, 0].astype(np.float32)
    np.testing.assert_array_equal(exported.stats["output_mean"].ravel(), means)
    np.testing.assert_allclose(exported.denormalize(exported.normalize(raw)), raw, rtol=1e-5, atol=1e-3)
    # What the manifest says about its source and shapes, and the config as the run wrote it.
    manifest = exported.manifest
    assert manifest["source"]["global_step"] == payload["progress"]["global_step"] == 2
    assert manifest["source"]["checkpoint"] == str((era5_run / "checkpoints" / "ckpt_latest.pt").resolve())
    assert exported.input_shape == (20, 16, 32) == exported.output_shape
    assert (
        manifest["torch_version"] == torch.__version__ and manifest["dlscale_version"] == dlscale.__version__
    )
    assert (era5_export / "config.yaml").read_bytes() == (era5_run / "config.yaml").read_bytes()
    assert exported.config["model"]["embed_dim"] == 32
    assert sorted(p.name for p in era5_export.iterdir()) == [
        "config.yaml", "manifest.json", "model.pt2", "model.safetensors", "stats",
    ]  # fmt: skip
    assert manifest["program"] == {"file": "model.pt2", "batch": "any", "matches_model": True}


# Runs with the venv's Python in isolated mode without the site module (-I -S): no .pth file is read, so neither
# the editable install of dlscale nor src/ is on sys.path; only the directory that holds torch and numpy is added.
WITHOUT_DLSCALE = """
import importlib.util, sys
site_packages, program, inputs, outputs, threads = sys.argv[1:]
sys.path.append(site_packages)
assert importlib.util.find_spec("dlscale") is None, "dlscale is importable"
import numpy, torch
torch.set_num_threads(int(threads))
module = torch.export.load(program).module()
with torch.no_grad():
    numpy.save(outputs, module(torch.from_numpy(numpy.load(inputs))).numpy())
print("ran without dlscale")
"""


@pytest.mark.slow
def test_the_program_gives_the_checkpoints_outputs_in_a_python_without_dlscale(
    era5_run, era5_export, tmp_path
):
    model, _ = checkpoint_model(era5_run / "checkpoints" / "ckpt_latest.pt")
    inputs = valid_batch(era5_run, 3)  # another batch size than the export's example of 2
    with torch.no_grad():
        expected = model(inputs).numpy()
    np.save(tmp_path / "inputs.npy", inputs.numpy())
    site_packages = Path(torch.__file__).parents[1]
    command = [sys.executable, "-I", "-S", "-c", WITHOUT_DLSCALE, str(site_packages),
               str(era5_export / "model.pt2"), "inputs.npy", "outputs.npy", str(torch.get_num_threads())]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ran without dlscale" in done.stdout, done.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "outputs.npy"), expected)


def test_best_checkpoint_and_the_command_report(era5_run, tmp_path, capsys):
    out = tmp_path / "nested" / "best"
    assert main(["export", str(era5_run), "--out", str(out), "--checkpoint", "best"]) == 0
    printed = capsys.readouterr().out
    assert f"Exported {era5_run / 'checkpoints' / 'ckpt_best.pt'} (era5_vit, config 'tiny'" in printed
    assert "model.safetensors" in printed and "stats/output_std.npy" in printed
    assert "torch.export program (any batch size), equal to the model bit for bit" in printed
    assert f"dlscale.load_model({str(out)!r})" in printed
    exported = dlscale.load_model(out)
    assert exported.manifest["source"]["checkpoint"].endswith("ckpt_best.pt")
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary directory left


# -------------------------------------------------------------------------------------------------- classifier

tiny_mnist_run = partial(tiny_run_config, MNIST_CONFIG)


def test_a_classifier_exports_and_reloads(tmp_path):
    data = tmp_path / "mnist"
    assert main(["data", "synth-mnist", "--out", str(data), "--preset", "tiny"]) == 0
    cfg = tiny_mnist_run(data, tmp_path / "runs", "data.limit_nsamples=64", "data.limit_nsamples_val=32",
                         "train.num_epochs=1")  # fmt: skip
    assert train(cfg) == 0
    run = tmp_path / "runs" / "tiny" / "00"
    out = tmp_path / "mnist_export"
    assert main(["export", str(run / "checkpoints" / "ckpt_latest.pt"), "--out", str(out)]) == 0

    exported = dlscale.load_model(out)
    model, _ = checkpoint_model(run / "checkpoints" / "ckpt_latest.pt")
    dataset = get_workload("cnn_mnist").build_datasets(cfg.data)["valid"]
    images = torch.stack([dataset[i][0] for i in range(4)])
    with torch.no_grad():
        log_probabilities = exported.model(images)
        assert torch.equal(log_probabilities, model(images))
    assert exported.input_shape == (1, 28, 28) and exported.output_shape == (10,)
    # Pixels on the [0, 1] scale normalize to the training samples; log-probabilities need no conversion.
    raw = torch.stack([torch.from_numpy(dataset.images[i]).float().div(255).unsqueeze(0) for i in range(4)])
    torch.testing.assert_close(exported.normalize(raw), images, rtol=0, atol=1e-6)
    assert exported.denormalize(log_probabilities) is not None
    assert torch.equal(exported.denormalize(log_probabilities), log_probabilities)
    assert exported.manifest["program"]["matches_model"] is True
    program = torch.export.load(out / "model.pt2").module()
    with torch.no_grad():
        assert torch.equal(program(images), log_probabilities)


# -------------------------------------------------------------------------------------------------- bad input


def refused(capsys, *arguments: str) -> str:
    """Run ``dlscale export ARGUMENTS``, expect exit status 2 and one line on stderr; return that line."""
    assert main(["export", *arguments]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_run_directory_without_a_checkpoint_is_refused_with_what_it_holds(tmp_path, capsys):
    run = tmp_path / "runs" / "tiny" / "00"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("tiny: {}\n")
    (run / "out.log").write_text("")
    out = tmp_path / "new" / "export"
    err = refused(capsys, str(run), "--out", str(out))
    assert f"{run}: no checkpoint to export (no checkpoints/ckpt_latest.pt): it holds" in err
    assert "config.yaml" in err and "dlscale export takes a run directory" in err
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "1979.h5").write_bytes(b"\x89HDF\r\n\x1a\n")
    err = refused(capsys, str(data), "--out", str(out))
    assert f"{data}: no checkpoint to export (no checkpoints/ckpt_latest.pt): it holds HDF5 files" in err
    assert not (tmp_path / "new").exists()  # nothing written, not even the parent of --out


def test_files_that_are_no_dlscale_checkpoint_are_refused(tiny_era5, tmp_path, capsys):
    out = tmp_path / "export"
    data_file = next((tiny_era5 / "train").glob("*.h5"))
    err = refused(capsys, str(data_file), "--out", str(out))
    assert f"{data_file} is not a dlscale checkpoint (an HDF5 file: a data file, not a checkpoint)" in err
    bare = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, bare)
    err = refused(capsys, str(bare), "--out", str(out))
    assert f"{bare}: is not a dlscale checkpoint" in err and "a bare model state_dict" in err
    assert "dlscale export takes a run directory" in err
    err = refused(capsys, str(tmp_path / "missing"), "--out", str(out))
    assert f"{tmp_path / 'missing'} does not exist; dlscale export takes" in err
    assert not out.exists()


def test_best_without_ckpt_best_is_refused(era5_run, tmp_path, capsys):
    run = tmp_path / "latest-only"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(era5_run / "checkpoints" / "ckpt_latest.pt", run / "checkpoints")
    err = refused(capsys, str(run), "--out", str(tmp_path / "export"), "--checkpoint", "best")
    assert f"{run}: has no checkpoints/ckpt_best.pt for --checkpoint best; it holds ckpt_latest.pt" in err
    assert "export one with --checkpoint latest" in err
    assert not (tmp_path / "export").exists()


def test_an_existing_out_is_refused_without_force(era5_run, era5_export, tmp_path, capsys):
    out = tmp_path / "export"
    shutil.copytree(era5_export, out)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    err = refused(capsys, str(era5_run), "--out", str(out))
    assert f"{out}: already exists; give another --out, or --force to replace it" in err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    # --force replaces an earlier export, never a directory that holds something else.
    assert main(["export", str(era5_run), "--out", str(out), "--force", "--checkpoint", "best"]) == 0
    assert dlscale.load_model(out).manifest["source"]["checkpoint"].endswith("ckpt_best.pt")
    other = tmp_path / "home"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    err = refused(capsys, str(era5_run), "--out", str(other), "--force")
    assert "is not a dlscale export (no manifest.json); --force replaces only an earlier export" in err
    assert (other / "thesis.tex").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "home"]


def test_an_error_during_the_export_leaves_nothing(era5_run, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(writer, "export_program", fail)
    with pytest.raises(RuntimeError, match="disk on fire"):
        dlscale.export(era5_run, tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------- tampered exports


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("flip a byte of the weights", "model.safetensors: changed since the export (its sha256 is"),
        ("edit the config", "config.yaml: changed since the export"),
        (
            "remove a statistic",
            "stats/input_std.npy: missing (manifest.json lists it): the export is incomplete",
        ),
        ("remove the manifest", "manifest.json: missing, so"),
    ],
)
def test_a_changed_or_incomplete_export_is_refused_by_name(era5_export, tmp_path, change, message):
    copy = tmp_path / "copy"
    shutil.copytree(era5_export, copy)
    if change == "flip a byte of the weights":
        weights = bytearray((copy / "model.safetensors").read_bytes())
        weights[-1] ^= 0x01  # the last byte of a weight: the file still parses, with another number in it
        (copy / "model.safetensors").write_bytes(bytes(weights))
    elif change == "edit the config":
        text = (copy / "config.yaml").read_text()
        (copy / "config.yaml").write_text(text.replace("embed_dim: 32", "embed_dim: 64"))
    elif change == "remove a statistic":
        (copy / "stats" / "input_std.npy").unlink()
    else:
        (copy / "manifest.json").unlink()
    with pytest.raises(ExportError) as caught:
        dlscale.load_model(copy)
    assert message in str(caught.value) and str(copy) in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


# ------------------------------------------------------------------------------------- no torch.export program


class DataDependent(torch.nn.Module):
    """Control flow on a value: torch.export cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x


def test_a_model_torch_export_cannot_trace_gets_no_program_and_one_warning(tmp_path, caplog):
    entry = export_program(DataDependent(), torch.ones(2, 3), tmp_path / "model.pt2")
    assert entry["file"] is None and "torch.export cannot export DataDependent" in entry["skipped"]
    assert not (tmp_path / "model.pt2").exists()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "no model.pt2" in warnings[0].getMessage()


def test_an_export_without_a_program_says_why_and_still_loads(era5_run, tmp_path, monkeypatch, capsys):
    def cannot(*args, **kwargs):
        raise NotImplementedError("an operation torch.export does not capture")

    monkeypatch.setattr(torch.export, "export", cannot)
    out = tmp_path / "export"
    assert main(["export", str(era5_run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    manifest = dlscale.load_model(out).manifest
    reason = "torch.export cannot export VisionTransformer (NotImplementedError: an operation torch.export"
    assert manifest["program"]["file"] is None and manifest["program"]["skipped"].startswith(reason)
    assert "model.pt2" not in manifest["files"] and not (out / "model.pt2").exists()
    assert f"no model.pt2: {reason}" in printed
