"""`dlscale plan` as a user runs it on the shipped configs: the printed table, the JSON, bad flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.models.parameters import count_parameters
from dlscale.models.vit import VisionTransformer

REPO = Path(__file__).resolve().parents[2]
CONFIG_FILE = REPO / "configs" / "vit_era5.yaml"
GB = 2**30


def run_plan(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["plan", "--yaml_config", str(CONFIG_FILE), "--config", "mp", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def mp_parameters() -> int:
    cfg = load_run_config(CONFIG_FILE, "mp")
    with torch.device("meta"):
        model = VisionTransformer(
            cfg.model, cfg.data.img_size, cfg.data.n_in_channels, cfg.data.n_out_channels
        )
    return count_parameters(model)


def test_plan_of_mp_on_four_40_gb_gpus(capsys, tmp_path):
    out_file = tmp_path / "plan.json"
    status, out, err = run_plan(capsys, "--gpus", "4", "--gpu_memory_gb", "40", "--json", str(out_file))
    assert status == 0, err
    document = json.loads(out_file.read_text())
    rows = document["rows"]

    # every factorization of 4 GPUs, each once, ranked 1..6; mp (8 heads, MLP 4096, batch 64) splits every way
    assert sorted((r["dp"], r["tp"], r["cp"]) for r in rows) == [
        (1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1),
    ]  # fmt: skip
    assert [r["rank"] for r in rows] == list(range(1, 7))
    assert all(r["valid"] for r in rows)
    for row in rows:
        assert row["fits"] == (row["memory_bytes"]["total"] <= 40 * GB)
        assert row["local_batch"] == 64 // row["dp"]
        parts = row["memory_bytes"]
        assert (
            parts["total"]
            == parts["model_states"]
            + parts["activations"]
            + parts["batch"]
            + parts["autocast_weight_copies"]
            + parts["cuda_allowance"]
        )
        traffic = row["comm_bytes_per_step"]
        assert (
            traffic["total"]
            == traffic["tensor_parallel"] + traffic["context_parallel"] + traffic["data_parallel"]
        )

    fitting = [r for r in rows if r["fits"]]
    too_big = [r for r in rows if not r["fits"]]
    assert fitting and too_big, "on 40 GB some layouts of mp fit and some do not"
    assert rows == fitting + too_big
    assert [r["comm_bytes_per_step"]["total"] for r in fitting] == sorted(
        r["comm_bytes_per_step"]["total"] for r in fitting
    )
    # tp alone (dp=1) holds all 64 samples of the global batch on every GPU: the norm inputs and linear-input
    # copies, replicated over tp, already come to about 47 GB (12 blocks x 64 x 4050 tokens x 16 x 1024 bytes)
    by_layout = {(r["dp"], r["tp"], r["cp"]): r for r in rows}
    assert not by_layout[(1, 4, 1)]["fits"]
    assert "more than the 40.00 GB per GPU" in by_layout[(1, 4, 1)]["reason"]

    # the config asks for tp=1 cp=1, i.e. dp=4
    requested = by_layout[(4, 1, 1)]
    asked = document["requested"]
    assert (asked["tp"], asked["cp"]) == (1, 1)
    assert (asked["rank"], asked["fits"]) == (requested["rank"], requested["fits"])
    assert asked["summary"].startswith("The config asks for tp=1 cp=1, i.e. dp=4 tp=1 cp=1 on 4 GPU(s)")
    assert asked["summary"] in " ".join(out.split())

    # the printed table: the same rows, GB with 2 decimals, parameter counts with separators
    assert f"{mp_parameters():,} parameters" in out
    assert "Layouts that fit" in out and "Layouts that do not fit" in out
    for row in rows:
        line = next(
            line
            for line in out.splitlines()
            if line.split()[:4] == [str(row["rank"]), *map(str, (row["dp"], row["tp"], row["cp"]))]
        )
        assert f"{row['parameters']['local']:,}" in line
        assert f"{row['memory_bytes']['total'] / GB:.2f}" in line
        assert f"{row['comm_bytes_per_step']['total'] / GB:.2f}" in line
    for row in too_big:
        assert row["reason"] in out
    assert f"JSON {out_file}" in out


def test_more_memory_per_gpu_fits_at_least_the_same_layouts(capsys, tmp_path):
    fits = {}
    for memory in ("40", "80"):
        path = tmp_path / f"{memory}.json"
        status, _, err = run_plan(capsys, "--gpus", "4", "--gpu_memory_gb", memory, "--json", str(path))
        assert status == 0, err
        fits[memory] = {
            (r["dp"], r["tp"], r["cp"]) for r in json.loads(path.read_text())["rows"] if r["fits"]
        }
    assert fits["40"] < fits["80"]


def test_one_gpu_has_one_layout_and_says_whether_it_fits(capsys, tmp_path):
    path = tmp_path / "one.json"
    status, out, _ = run_plan(capsys, "--gpus", "1", "--gpu_memory_gb", "80", "--json", str(path))
    assert status == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert (row["dp"], row["tp"], row["cp"], row["local_batch"]) == (1, 1, 1, 64)
    verdict = "fits (" if row["fits"] else f"does not fit: {row['reason']}"
    assert f"dp=1 tp=1 cp=1 on 1 GPU(s) (rank 1 of 1): {verdict}" in " ".join(out.split())


@pytest.mark.parametrize("gpus", ["0", "-2"])
def test_a_bad_gpu_count_is_one_clear_error_naming_the_flag(capsys, gpus):
    status, out, err = run_plan(capsys, f"--gpus={gpus}")
    assert status == 2
    assert out == ""
    assert f"--gpus: must be a whole number of GPUs >= 1, got {gpus}" in err
    assert "Traceback" not in err


def test_a_bad_gpu_memory_is_refused(capsys):
    status, _, err = run_plan(capsys, "--gpus", "4", "--gpu_memory_gb", "0")
    assert status == 2
    assert "--gpu_memory_gb: must be a number of GB > 0, got 0.0" in err


# ---- workloads without an analytic cost model: the traced plan -----------------------------------------------


@pytest.fixture(scope="module")
def synthetic_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The `tiny` MNIST and cosmology data sets, made by `dlscale data` itself."""
    root = tmp_path_factory.mktemp("data")
    made = {}
    for workload, generator in (("cnn_mnist", "synth-mnist"), ("unet_cosmo", "synth-cosmo")):
        made[workload] = root / workload
        assert main(["data", generator, "--out", str(made[workload]), "--preset", "tiny"]) == 0
    return made


def plan_workload(capsys, workload: str, data: Path, *args: str) -> tuple[int, str, str]:
    config = REPO / "configs" / f"{workload}.yaml"
    status = main(
        ["plan", "--yaml_config", str(config), "--config", "tiny", "--set", f"data.root={data}", *args]
    )
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_plan_of_the_cnn_is_a_table_of_ddp_and_fsdp2(capsys, tmp_path, synthetic_data):
    out_file = tmp_path / "cnn.json"
    status, out, err = plan_workload(
        capsys, "cnn_mnist", synthetic_data["cnn_mnist"], "--gpus", "2", "--gpu_memory_gb", "8",
        "--json", str(out_file),
    )  # fmt: skip
    assert status == 0, err
    document = json.loads(out_file.read_text())
    assert document["estimator"] == "traced"
    assert document["sample"] == {"input": {"shape": [1, 28, 28], "dtype": "float32"},
                                  "target": {"shape": [], "dtype": "int64"}}  # fmt: skip
    assert document["trace"]["parameters"] == 1_199_882
    ddp, fsdp = document["rows"]
    assert (ddp["layout"], fsdp["layout"]) == ("DDP dp=2", "FSDP2 dp=2")
    for row in (ddp, fsdp):
        assert row["valid"] and row["fits"] and row["local_batch"] == 16  # tiny's global batch 32 over 2
        parts = row["memory_bytes"]
        assert parts["total"] == (
            parts["model_states"] + parts["activations"] + parts["batch"]
            + parts["autocast_weight_copies"] + parts["cuda_allowance"]
        )  # fmt: skip
        line = next(line for line in out.splitlines() if line.strip().startswith(row["layout"]))
        assert f"{row['stored_parameters']:,}" in line and f"{parts['total'] / GB:.2f}" in line
    # FSDP2 keeps half of each parameter's rows; the activations are the same local batch's
    assert fsdp["stored_parameters"] < ddp["stored_parameters"] == 1_199_882
    assert fsdp["memory_bytes"]["activations"] == ddp["memory_bytes"]["activations"] > 0
    assert "Data-parallel layouts:" in out and "Layouts that fit" not in out
    text = " ".join(out.split())
    assert "workload 'cnn_mnist' declares no tensor/context-parallel plan" in text
    assert "The config asks for data_parallel 'ddp', i.e. DDP dp=2 on 2 GPU(s): fits (" in text
    assert f"JSON {out_file}" in out


def test_plan_of_the_unet_on_one_gpu_and_on_four(capsys, tmp_path, synthetic_data):
    data = synthetic_data["unet_cosmo"]
    one = tmp_path / "one.json"
    status, out, err = plan_workload(
        capsys, "unet_cosmo", data, "--gpus", "1", "--json", str(one), "--set", "amp_mode=bf16"
    )
    assert status == 0, err
    (row,) = json.loads(one.read_text())["rows"]
    assert (row["layout"], row["local_batch"]) == ("one GPU", 4)
    assert row["memory_bytes"]["autocast_weight_copies"] > 0  # bf16: half-precision copies of the weights
    four = tmp_path / "four.json"
    channels_last = ("--set", "model.channels_last=true")
    status, out, err = plan_workload(
        capsys, "unet_cosmo", data, "--gpus", "4", "--json", str(four), *channels_last
    )
    assert status == 0, err
    ddp, fsdp = json.loads(four.read_text())["rows"]
    assert ddp["local_batch"] == 1 and ddp["fits"]
    # FSDP2 cannot shard channels-last convolution weights: the plan says so instead of estimating
    assert not fsdp["valid"] and "FSDP2 shards only contiguous parameters" in fsdp["reason"]
    assert "cannot run: FSDP2 shards only contiguous parameters" in " ".join(out.split())


def test_a_batch_that_does_not_split_over_the_gpus_is_said_so(capsys, synthetic_data):
    status, out, err = plan_workload(capsys, "cnn_mnist", synthetic_data["cnn_mnist"], "--gpus", "3")
    assert status == 0, err
    assert "cannot run: " in out and "not divisible by the 3 data-parallel ranks" in " ".join(out.split())


def test_missing_data_is_one_clear_error_naming_the_path(capsys, tmp_path):
    status, out, err = plan_workload(capsys, "cnn_mnist", tmp_path / "nowhere", "--gpus", "2")
    assert status == 2
    assert str(tmp_path / "nowhere") in err and "Traceback" not in err
