"""``dlscale data import-era5`` end to end: the command on an ARCO-ERA5 store prints the next step, bad input is
one line with exit status 2, and the tiny ViT trained on an imported store gives the same losses as on the same
fields written directly by ``synth-era5``."""

from __future__ import annotations

import csv
import json
import os
import shlex
from pathlib import Path

import h5py
import numpy as np
import pytest

pytest.importorskip("xarray")
pytest.importorskip("zarr")

from era5_stores import random_truth, six_hourly_times, write_arco, write_cds, write_wb2  # noqa: E402
from mounted_disks import mounted_tmpfs  # noqa: E402

from dlscale.cli import main  # noqa: E402
from dlscale.data.era5.importing.importer import IMPORT_LOCK  # noqa: E402
from dlscale.data.era5.layout import ERA5_CHANNELS  # noqa: E402
from dlscale.runtime.output_directory import OutputDirectoryLock  # noqa: E402

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


@pytest.mark.slow
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


# --- full disks, a second import at once, the climatology's missing days ----------------------------------------


def import_command(source: Path, out: Path) -> list[str]:
    return [
        "data",
        "import-era5",
        str(source),
        "--out",
        str(out),
        "--split",
        SYNTH_SPLIT,
        "--progress",
        "none",
    ]


def leftovers(directory: Path) -> list[str]:
    """The temporaries of atomic writes (files and directories) anywhere under ``directory``."""
    return sorted(str(path) for path in directory.rglob("*") if ".tmp-" in path.name or ".old-" in path.name)


@pytest.mark.parametrize(
    ("size", "stage"),
    [("1500k", "a year file"), ("5m", "the climatology")],  # 4 year files of ~1 MB fit in 5 MB, not the store
)
def test_a_full_disk_is_one_line_exit_74_naming_out_and_leaves_no_temporary(
    arco_of_synthetic, tmp_path, capsys, size, stage
):
    out = tmp_path / "era5"
    with mounted_tmpfs(out, f"size={size}"):
        assert main(import_command(arco_of_synthetic, out)) == 74, stage
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and "No space left on device (ENOSPC)" in error[0], error
        assert error[0].endswith("the disk is full: free some space or choose another --out"), error
        assert leftovers(out) == []
        if stage == "a year file":  # said before the first file, not when the disk fills in a file's middle
            assert ": cannot write the 4 year files to import: " in error[0] and "needed" in error[0], error
            assert not list(out.rglob("*.h5"))
        if stage == "the climatology":  # the year files are kept, and a rerun with room would continue
            assert "/stats/climatology.zarr: cannot write the climatology" in error[0]
            assert len(list(out.glob("*/*.h5"))) == 4 and not (out / "stats" / "climatology.zarr").exists()


def test_an_out_inside_the_source_store_is_refused_and_nothing_written(arco_of_synthetic, capsys):
    before = sorted(path.name for path in arco_of_synthetic.iterdir())
    for out in (arco_of_synthetic, arco_of_synthetic / "era5"):
        assert main(import_command(arco_of_synthetic, out)) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and f"--out {out} is inside the source store" in error[0], error
    assert sorted(path.name for path in arco_of_synthetic.iterdir()) == before


@pytest.mark.parametrize("where", ["out", "its parent"])
def test_a_read_only_out_is_one_line_exit_74_naming_out(arco_of_synthetic, tmp_path, capsys, where):
    read_only = tmp_path / "read_only"
    out = read_only if where == "out" else read_only / "era5"
    with mounted_tmpfs(read_only, "ro,size=64k"):
        assert main(import_command(arco_of_synthetic, out)) == 74
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "Read-only file system (EROFS)" in error[0], error
    assert error[0].endswith("the file system is read-only: choose a writable --out"), error


def test_a_second_import_into_the_same_out_while_one_writes_is_refused_with_exit_75(
    arco_of_synthetic, tmp_path, capsys
):
    out = tmp_path / "era5"
    assert main(import_command(arco_of_synthetic, out)) == 0
    # OUT as while an import of the same selection writes it: its plan, no manifest, a year file being written.
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "import.json").write_text(
        json.dumps({"generator": manifest["generator"], "selection": manifest["selection"]})
    )
    (out / "manifest.json").unlink()
    (out / "train" / "1980.h5").unlink()
    being_written = out / "train" / f".1980.h5.tmp-{os.getpid()}-0a1b2c3d"
    being_written.write_bytes(b"half a year")
    capsys.readouterr()
    with OutputDirectoryLock(out, "--out", lock_file=out / IMPORT_LOCK):
        assert main(import_command(arco_of_synthetic, out)) == 75
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"{out}: another process is writing it now: pid {os.getpid()}" in error[0], (
        error
    )
    # Never taken for a killed import's leftover while its writer runs; nothing else touched either.
    assert being_written.read_bytes() == b"half a year"
    assert not (out / "manifest.json").exists() and not (out / "train" / "1980.h5").exists()


@pytest.mark.slow
def test_the_days_of_the_year_the_climatology_lacks_are_named_at_import(arco_of_synthetic, tmp_path, capsys):
    out = tmp_path / "era5"
    assert main(import_command(arco_of_synthetic, out)) == 0
    missing = json.loads((out / "stats" / "climatology.zarr" / ".zattrs").read_text())["days_without_data"]
    assert missing == list(range(missing[0], missing[-1] + 1))  # the train years hold a few days of January
    printed = capsys.readouterr().out.splitlines()
    warnings = [line for line in printed if " WARNING " in line and "no climatology for" in line]
    assert len(warnings) == 1, printed
    assert (
        f"no climatology for {len(missing)} of the 366 days of the year, days {missing[0]}-{missing[-1]} ("
        in (warnings[0])
    )
    assert "stops before its rollout" in warnings[0] and "--climatology time-mean" in warnings[0]
    assert main(import_command(arco_of_synthetic, out)) == 0  # a rerun keeps the store, and says it again
    assert sum("no climatology for" in line for line in capsys.readouterr().out.splitlines()) == 1
