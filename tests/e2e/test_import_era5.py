"""``dlscale data import-era5`` end to end: the command on an ARCO-ERA5 store prints the next step, bad input is
one line with exit status 2, and the tiny ViT trained on an imported store gives the same losses as on the same
fields written directly by ``synth-era5``."""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

import h5py
import numpy as np
import pytest

pytest.importorskip("xarray")
pytest.importorskip("zarr")

from era5_stores import random_truth, six_hourly_times, write_arco, write_cds, write_wb2  # noqa: E402

from dlscale.cli import main  # noqa: E402
from dlscale.data.era5.layout import ERA5_CHANNELS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "vit_era5.yaml"
SYNTH_SPLIT = "1979-1980:train,1981:valid,1982:test"  # the tiny preset's years


@pytest.fixture(scope="module")
def arco_of_synthetic(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ARCO-ERA5 store (hourly, long names, levels) holding exactly the fields of the tiny synthetic set."""
    years = {int(path.stem): path for path in sorted(tiny_era5.glob("*/*.h5"))}
    blocks = []
    for year in sorted(years):
        with h5py.File(years[year], "r") as handle:
            blocks.append(handle["fields"][...])
    fields = np.concatenate(blocks)
    truth = {name: fields[:, channel] for channel, name in enumerate(ERA5_CHANNELS)}
    times = six_hourly_times(sorted(years), len(blocks[0]))
    return write_arco(tmp_path_factory.mktemp("arco") / "era5.zarr", truth, times)


def test_the_command_imports_and_prints_the_training_command(arco_of_synthetic, tmp_path, capsys):
    out = tmp_path / "era5"
    assert (
        main(["data", "import-era5", str(arco_of_synthetic), "--out", str(out), "--split", SYNTH_SPLIT]) == 0
    )
    printed = capsys.readouterr().out
    assert "import-era5: wrote 4 year files (0 kept from an earlier run)" in printed
    assert "peak memory" in printed and "GB/s" in printed
    assert (
        f"next step: dlscale train --yaml_config configs/vit_era5.yaml --config tiny --set data.root={out} "
        "--set 'data.img_size=[16,32]' --set data.n_in_channels=20 --set data.n_out_channels=20"
    ) in printed  # the tiny config fits this 16 x 32 grid (tests/commands/test_era5_next_step.py: others)
    assert "multiples of 4 up to [16, 32]" in printed
    assert (
        main(["data", "import-era5", str(arco_of_synthetic), "--out", str(out), "--split", SYNTH_SPLIT]) == 0
    )
    assert "already holds this import" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--channels", "u10,q700"], "no variable for channel q700 (looked for 'specific_humidity' or 'q')"),
        (["--split", "1979:train"], "--split '1979:train' has no valid years"),
        (["--dt", "5"], "--dt 5 must divide 24 hours"),
        ([], "no 6-hourly step in 1983, 1984"),  # the tutorial's default years are not in the store
        (
            ["--split", SYNTH_SPLIT, "--climatology-years", "1990-2019"],
            "--climatology-years 1990-2019: the import of",
        ),
        (["--split", SYNTH_SPLIT, "--climatology-years", "1980-1979"], "ends before it starts"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(arco_of_synthetic, tmp_path, capsys, arguments, message):
    out = tmp_path / "era5"
    assert main(["data", "import-era5", str(arco_of_synthetic), "--out", str(out), *arguments]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("dlscale: error: ") and message in error[0], error
    assert not out.exists()


def losses(expdir: Path) -> tuple[list[float], list[float]]:
    run = expdir / "tiny" / "00"
    with (run / "metrics" / "steps.csv").open(newline="") as file:
        steps = [float(row["train_loss"]) for row in csv.DictReader(file)]
    history = json.loads((run / "summary.json").read_text())["history"]
    return steps, [epoch["val_loss"] for epoch in history]


@pytest.mark.slow
def test_training_on_an_imported_store_equals_training_on_the_same_fields_written_directly(
    arco_of_synthetic, tiny_era5, tmp_path
):
    imported = tmp_path / "imported"
    assert (
        main(["data", "import-era5", str(arco_of_synthetic), "--out", str(imported), "--split", SYNTH_SPLIT])
        == 0
    )
    for name in ("global_means.npy", "global_stds.npy", "time_means.npy"):  # float64 statistics both ways
        np.testing.assert_array_equal(np.load(imported / "stats" / name), np.load(tiny_era5 / "stats" / name))

    def train_on(data: Path, expdir: Path) -> tuple[list[float], list[float]]:
        settings = [
            f"data.root={data}", f"log.expdir={expdir}", "log.progress=none", "log.tensorboard=false",
            "data.limit_nsamples=16", "data.limit_nsamples_val=8",
        ]  # fmt: skip
        command = ["train", "--yaml_config", str(CONFIG), "--config", "tiny"]
        assert main([*command, *(part for setting in settings for part in ("--set", setting))]) == 0
        return losses(expdir)

    direct = train_on(tiny_era5, tmp_path / "direct_runs")
    through_import = train_on(imported, tmp_path / "imported_runs")
    assert len(direct[0]) == 8 and len(direct[1]) == 2  # 2 epochs of 4 steps
    assert through_import == direct


DOCUMENTED = (REPO / "README.md", REPO / "docs" / "your-era5.md")


def documented_commands() -> list[list[str]]:
    """Every `dlscale data import-era5 ...` command of the README and docs/your-era5.md, as argument lists
    (continuation lines joined)."""
    commands = []
    for path in DOCUMENTED:
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if line.startswith("dlscale data import-era5 ") and "SOURCE" not in line:
                commands.append(shlex.split(line.split("#")[0])[1:])
    return commands


@pytest.mark.slow
def test_the_documented_commands_run_as_written_on_stores_of_their_schemas(tmp_path, monkeypatch, capsys):
    """The README's and the guide's commands, each with its gs:// store replaced by a tiny local store of that
    schema (all the years their --split names, two 6-hourly steps each) and $SCRATCH by a temporary directory."""
    commands = documented_commands()
    assert len(commands) >= 5, commands  # 2 in the README, 3 in the guide
    monkeypatch.chdir(tmp_path)
    years = list(range(1979, 2022))
    times = six_hourly_times(years, 2)
    truth = random_truth(len(times), 9, 16)
    stores = {
        "weatherbench2": write_wb2(tmp_path / "wb2.zarr", truth, times),
        "arco-era5": write_arco(tmp_path / "arco.zarr", truth, times),
    }
    cds_years = slice(2 * years.index(2010), None)  # the guide's CDS command names 2010-2021
    write_cds(tmp_path / "downloads", {k: v[cds_years] for k, v in truth.items()}, times[cds_years])
    for index, argv in enumerate(commands):
        source = argv[2]
        if source.startswith("gs://"):
            argv[2] = str(next(store for key, store in stores.items() if key in source))
        argv = [arg.replace("$SCRATCH", str(tmp_path / f"scratch{index}")) for arg in argv]
        assert main(argv) == 0, argv
        out = Path(argv[argv.index("--out") + 1])
        assert (out / "manifest.json").is_file() and (out / "stats" / "time_means.npy").is_file(), argv
        assert "next step: dlscale train" in capsys.readouterr().out
