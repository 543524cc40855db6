"""One ``dlscale tune``: set up the climb on every rank of the launch, run it, and write what it found.

Files (``out`` is the tuned YAML; everything else goes beside it):

* ``<out>``: the tuned config (:mod:`dlscale.tuning.report`); ``<out>.md``, ``.png``, ``.json``: the climb;
* ``<stem>_trials/cache.json``: the finished trials, so that the same command continues an interrupted tune;
  ``<stem>_trials/tune.log``: the tune's log; ``trials/`` and ``checks/``: each trial's bench JSON and each
  numerics check's short run.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from dlscale.config import load_run_config
from dlscale.errors import DlscaleError
from dlscale.report.figures import save_png
from dlscale.report.run_dir import setup_logging
from dlscale.run.assembly import batch_sizes
from dlscale.run.process_group import distributed_run
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import is_distributed, share_text_from_main
from dlscale.runtime.launch import detect_process
from dlscale.runtime.storage import as_storage_error, probe_writable
from dlscale.runtime.strict_json import to_json
from dlscale.tuning.cache import TuneCache
from dlscale.tuning.climb import Climb, TuneFailed, TuneOptions, TuneResult
from dlscale.tuning.knobs import BATCH_KEY, TuneContext
from dlscale.tuning.report import (
    changed_sections,
    extends_reference,
    tune_document,
    tune_figure,
    tune_table,
    tuned_yaml,
    yaml_header,
)
from dlscale.tuning.run_backend import ConfigSource, RunBackend, TrialLengths
from dlscale.tuning.settings import config_keys, lr_note, read_settings, run_length_keys
from dlscale.version import __version__

log = logging.getLogger("dlscale.tune")


@dataclass(frozen=True)
class TuneOutputs:
    """The climb and where rank 0 wrote its results (the same paths on every rank)."""

    result: TuneResult
    tuned_yaml: Path
    tuned_config: str  # the config's name in it
    table: Path
    plot: Path
    record: Path


def default_out(config: str) -> Path:
    """``tuned/<config>_tuned.yaml``."""
    return Path("tuned") / f"{config}_tuned.yaml"


def run_tune(
    source: ConfigSource, out: Path, options: TuneOptions, lengths: TrialLengths, command: str
) -> TuneOutputs:
    """Tune ``source`` on every rank of the launch; rank 0 writes the outputs, every rank gets the climb."""
    process = detect_process()
    work_dir = out.parent / f"{out.stem}_trials"

    def tune_logging() -> None:
        setup_logging(work_dir / "tune.log", enabled=process.is_main)

    # The config first: a wrong key, value or workload is one line and leaves no directory behind.
    start_cfg = source.load()
    if process.is_main:
        probe_writable(work_dir)  # a read-only or full disk is one line now, not after the first trial
    tune_logging()
    log.info(
        "dlscale %s tune: config %r from %s, budget %.3g min",
        __version__,
        start_cfg.name,
        start_cfg.source,
        options.budget_s / 60,
    )
    device = Device.select(process.local_rank)
    with distributed_run(process, device, start_cfg.parallel.timeout_s) as ending:
        model_parallel = start_cfg.parallel.tensor_parallel * start_cfg.parallel.context_parallel
        dp = max(1, process.world_size // model_parallel)
        context = TuneContext(
            on_gpu=device.is_gpu,
            data_parallel_ranks=dp,
            ddp=dp > 1 and start_cfg.parallel.data_parallel == "ddp" and not start_cfg.parallel.noddp,
            cpus_per_rank=max(1, (os.cpu_count() or 1) // process.local_world_size),
            bf16=device.computes_bf16,
        )
        # What the trials' numbers depend on; the climb's own options (--min_gain, --loss_tolerance, --skip)
        # only change the decisions, which a resumed tune makes again from the same numbers.
        fingerprint = {
            "config": start_cfg.to_dict(),
            "lengths": asdict(lengths),
            "device": device.name,
            "world_size": process.world_size,
        }
        cache = TuneCache(work_dir / "cache.json" if process.is_main else None, fingerprint)
        if cache.resumed:
            log.info("TUNE::continuing from %s: %d finished trial(s) and check(s)", cache.path, cache.resumed)
        backend = RunBackend(source, start_cfg, work_dir, lengths, process, device, dp, tune_logging)

        def agree(value: Any) -> Any:
            if not is_distributed():
                return value
            return json.loads(share_text_from_main(to_json(value), device) or "null")

        climb = Climb(
            backend,
            context,
            options,
            cache,
            agree=agree,
            lr_note=lambda before, after: lr_note(start_cfg, before[BATCH_KEY] * dp, after[BATCH_KEY] * dp),
        )
        try:
            result = climb.run(read_settings(start_cfg, dp))
        except TuneFailed as error:
            ending.alike = True
            raise DlscaleError(f"{start_cfg.where}: {error}") from None
        outputs = output_paths(result, source.config, out)
        if process.is_main:
            try:
                write_outputs(outputs, source, start_cfg, dp, device.name, command)
            except OSError as error:
                raise as_storage_error(error) or error from None
        ending.alike = True
        return outputs


def output_paths(result: TuneResult, config: str, out: Path) -> TuneOutputs:
    """Where the outputs of a tune of ``config`` to ``out`` go."""
    suffixed = (out.with_suffix(suffix) for suffix in (".md", ".png", ".json"))
    return TuneOutputs(result, out, f"{config}_tuned", *suffixed)


def write_outputs(
    outputs: TuneOutputs, source: ConfigSource, start_cfg: Any, dp: int, device: str, command: str
) -> None:
    """The tuned YAML (checked by reading it back), the table, the plot and the record, where ``outputs`` says."""
    result, out, name = outputs.result, outputs.tuned_yaml, outputs.tuned_config
    new_global = result.final[BATCH_KEY] * dp
    length_keys, length_notes = run_length_keys(start_cfg, new_global, dp)
    tuned_cfg = source.load({**config_keys(start_cfg, result.final, dp), **length_keys})
    original = load_run_config(source.yaml_config, source.config)
    sections = changed_sections(original.to_dict(), tuned_cfg.to_dict())
    date = datetime.now().astimezone().isoformat(timespec="seconds")
    header = yaml_header(result, command, device, date, name, out) + length_notes
    text = tuned_yaml(name, extends_reference(Path(start_cfg.source), source.config, out), sections, header)
    write_text_atomically(out, text)
    # The file must train what was measured: read it back as `dlscale train` will.
    written = load_run_config(out, name)
    if written.to_dict() != tuned_cfg.to_dict():
        raise DlscaleError(
            f"{out}: the tuned config does not read back as the tuned settings (a dlscale bug)"
        )
    title = f"dlscale tune {source.config} on {device}"
    table = tune_table(result)
    notes = [f"- {line}" for line in length_notes]
    notes += [f"- local batch: {t.lr_note}" for t in result.trials if t.kept and t.lr_note]
    speedup = (
        f"**Speed-up over the start: {result.speedup.describe()}**"
        if result.speedup
        else "No change was kept."
    )
    markdown = "\n".join(
        [
            f"# {title}",
            "",
            f"`{command}`, {date}, dlscale {__version__}, torch {torch.__version__}",
            "",
            speedup,
            "",
            f"Stopped: {result.stop_reason}.",
            "",
            *table,
            "",
            f"Tuned config: `{out}` (config `{name}`); train it with `dlscale train --yaml_config {out} --config {name}`.",
            *([""] + notes if notes else []),
            "",
        ]
    )
    paths = {"table": outputs.table, "plot": outputs.plot, "record": outputs.record}
    write_text_atomically(paths["table"], markdown)
    save_png(tune_figure(result, title), paths["plot"])
    context = {
        "config": {"name": source.config, "source": start_cfg.source, "overrides": list(start_cfg.overrides)},
        "tuned": {"file": str(out), "config": name, "keys": sections},
        "device": device,
        "data_parallel_ranks": dp,
        "dlscale_version": __version__,
        "torch_version": torch.__version__,
        "command": command,
        "date": date,
        "start_global_batch": batch_sizes(start_cfg, dp)[0],
    }
    write_text_atomically(paths["record"], to_json(tune_document(result, context)))
    for line in table:
        log.info("%s", line)
    log.info("TUNE::%s", speedup.strip("*"))
    log.info("TUNE::tuned config %s (config %s); table %s, plot %s, record %s", out, name, *paths.values())
