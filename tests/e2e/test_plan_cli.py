"""`dlscale plan` as a user runs it on the shipped configs: the printed table, the JSON, bad flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.models.vit import VisionTransformer, count_parameters

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
