"""How long a checkpoint save blocks the training loop, and rank 0's peak host memory during it, for three ways of
saving an FSDP2-sharded ViT on CPU with gloo.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/checkpoint_save.py [--world-sizes 2 4 8] [--trials 3]
        [--embed 768 --depth 12] [--quick]

Methods (every rank calls them at the same point, as a training loop does):

* ``gathered``: today's single file. Every rank gathers the model and the optimizer moments to their serial
  shapes (``full_model_state``, ``full_optimizer_state``: collectives), rank 0 alone writes them with
  ``save_checkpoint``; the loop is blocked until a barrier after rank 0's write.
* ``dcp-sync``: :class:`ShardedCheckpointWriter` without ``asynchronous``: every rank writes its own shards with
  torch.distributed.checkpoint; blocked for the whole ``save`` and a barrier.
* ``dcp-async``: the same writer with ``asynchronous``: blocked while ``save`` stages a copy of the shards in host
  memory; a thread writes them. "written after" is the time until ``finish`` returns (every shard written, the
  checkpoint published).

Each (world size, method) runs in fresh processes (memory the allocator keeps from one method's save does not
flatter the next's), ``--trials`` timed saves after one warm-up save, reported separately: the warm-up allocates
what later saves reuse (the async stager's buffers). Each save writes into a fresh directory under ``--tmp`` that is
removed after it. Before each save every rank returns its allocator's free memory to the system (glibc's
``malloc_trim``), so that freed memory the allocator kept does not hide a save's allocations. Rank 0's host memory
is sampled (VmRSS of /proc/self/status) from a thread every ``--sample-ms`` during the save (until ``finish`` for
async); the peak over the RSS just before the save, and over the RSS before the first save (what earlier saves
left allocated: the async stager's buffers), is set against rank 0's own shards (weights and Adam's two moments,
local tensors) and the full state.

Results: ``benchmarks/results/<date>-cpu-checkpoint-save.json``, ``.md`` and ``.png`` (``-quick`` added with
``--quick``). ``--from-json RECORD`` writes the Markdown and PNG again from a record (a "meaning" paragraph
added to it is printed at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from benchmark_text import MIB, command_line, mib
from matplotlib.figure import Figure

from dlscale.perf.bench.intervals import mean_interval
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device
from dlscale.runtime.local_ranks import free_port

REPO = Path(__file__).resolve().parents[1]
METHODS = ("gathered", "dcp-sync", "dcp-async")
QUICK = {
    "embed": 64,
    "depth": 2,
    "heads": 4,
    "patch": 8,
    "height": 32,
    "width": 64,
    "channels": 20,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", help="default 2 4 8 (2 with --quick)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument(
        "--trials",
        type=int,
        default=3,
        help="timed saves per method, after one warm-up",
    )
    parser.add_argument("--embed", type=int, default=768)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--patch", type=int, default=8)
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--channels", type=int, default=20)
    parser.add_argument(
        "--zero-grads",
        action="store_true",
        help="give Adam its moments from zero gradients instead of a forward and backward pass",
    )
    parser.add_argument("--sample-ms", type=float, default=2.0, help="RSS sampling period of rank 0")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a model of a few MB on 2 ranks (unless --world-sizes): a smoke test",
    )
    parser.add_argument("--tmp", default="/tmp", help="where each save's temporary directory goes")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument(
        "--from-json",
        help="write the Markdown and PNG again from this run record instead of measuring",
    )
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.world_sizes is None:
        args.world_sizes = [2] if args.quick else [2, 4, 8]
    return args


# ------------------------------------------------------------------------------------------- measuring


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRss:
    """Samples this process's RSS from a thread while in use: ``.before`` and ``.peak`` in bytes."""

    def __init__(self, period_s: float):
        self.period_s = period_s
        self.before = self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        self.before = self.peak = _rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            self.samples += 1
            self._stop.wait(self.period_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())

    @property
    def increase(self) -> int:
        return self.peak - self.before


def _trim_heap() -> None:
    """Return the allocator's free memory to the system (glibc's malloc_trim), so that the RSS before a save
    is the memory in use: else a save's new tensors reuse what setup or an earlier save freed, unseen."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if type(value).__name__ == "DTensor" else value


def state_sizes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """(bytes of this rank's own tensors: model state and optimizer state; bytes of the full, serial state)."""
    tensors = [v for v in model.state_dict().values() if torch.is_tensor(v)]
    for entries in optimizer.state.values():
        tensors += [v for v in entries.values() if torch.is_tensor(v)]
    own = sum(_local(t).numel() * t.element_size() for t in tensors)
    full = sum(t.numel() * t.element_size() for t in tensors)  # a DTensor's numel is its global one
    return own, full


def build(
    args: argparse.Namespace,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, int]:
    """The ViT, sharded with FSDP2 over the world, and Adam with its moments (one step); and its parameters."""
    import torch.distributed as dist

    from dlscale.models.vit import VisionTransformer
    from dlscale.models.vit_config import ViTConfig
    from dlscale.parallel.fully_sharded import shard_fully

    torch.manual_seed(0)
    cfg = ViTConfig(
        embed_dim=args.embed,
        depth=args.depth,
        num_heads=args.heads,
        patch_size=args.patch,
    )
    img_size = (args.height, args.width)
    model = VisionTransformer(cfg, img_size, args.channels, args.channels)
    parameters = sum(p.numel() for p in model.parameters())
    shard_fully(model, model.blocks, None, "cpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    if args.zero_grads:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    else:
        torch.manual_seed(1 + dist.get_rank())
        out = model(torch.randn(1, args.channels, *img_size))
        out.float().pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    return model, optimizer, parameters


def _fresh_directory(args: argparse.Namespace) -> Path:
    """A new temporary directory made by rank 0, its path broadcast to every rank."""
    import torch.distributed as dist

    found = [tempfile.mkdtemp(prefix="dlscale-ckpt-bench-", dir=args.tmp) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(found, src=0)
    return Path(found[0])


def _max_over_ranks(value: float) -> float:
    import torch.distributed as dist

    found = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return float(found.item())


def save_once(
    method: str,
    model: Any,
    optimizer: Any,
    writer: Any,
    step: int,
    args: argparse.Namespace,
) -> dict:
    """One save by ``method`` into a fresh directory (removed after): blocked seconds, rank 0's memory peak."""
    import torch.distributed as dist

    from dlscale.checkpoint.directory import CheckpointDir
    from dlscale.checkpoint.distributed_state import model_tensors, optimizer_parts
    from dlscale.checkpoint.files import save_checkpoint
    from dlscale.checkpoint.sharded_state import full_model_state, full_optimizer_state

    rank = dist.get_rank()
    directory = _fresh_directory(args)
    if writer is not None:
        writer.checkpoints = CheckpointDir(directory)  # one writer per run (its staging buffers are reused)
    gc.collect()
    _trim_heap()
    dist.barrier()
    written = None
    with PeakRss(args.sample_ms / 1000) as memory:
        began = time.perf_counter()
        if method == "gathered":
            payload = {
                "model": full_model_state(model),
                "optimizer": full_optimizer_state(model, optimizer),
                "progress": {"global_step": step},
                "meta": {},
            }
            if rank == 0:
                save_checkpoint(payload, directory / "ckpt_latest.pt")
            del payload
            dist.barrier()
            blocked = time.perf_counter() - began
        else:
            tensors = model_tensors(model)
            optimizer_tensors, rest = optimizer_parts(model, optimizer)
            tensors.update(optimizer_tensors)
            header = {
                "optimizer": rest,
                "progress": {"global_step": step},
                "meta": {},
                "sharded": {
                    "writer": "torch.distributed.checkpoint",
                    "tensors": len(tensors),
                },
            }
            writer.save(tensors, header, step, is_best=False)
            if method == "dcp-sync":
                dist.barrier()
            blocked = time.perf_counter() - began
            if method == "dcp-async":
                writer.finish()
                written = time.perf_counter() - began
            del tensors, optimizer_tensors
    result = {
        "blocked_s": blocked,
        "blocked_max_s": _max_over_ranks(blocked),
        "written_s": written,
        "written_max_s": None if written is None else _max_over_ranks(written),
        "rss_before_bytes": memory.before,
        "peak_increase_bytes": memory.increase,
        "rss_samples": memory.samples,
    }
    dist.barrier()
    if rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
    return result


def rank_main(
    rank: int,
    world_size: int,
    method: str,
    port: int,
    args: argparse.Namespace,
    out: str,
) -> None:
    """One rank: build, one warm-up save and ``--trials`` timed ones by ``method``; rank 0 writes ``out``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    import torch.distributed as dist

    from dlscale.checkpoint.directory import CheckpointDir
    from dlscale.checkpoint.sharded_writer import ShardedCheckpointWriter

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        began = time.perf_counter()
        model, optimizer, parameters = build(args)
        own, full = state_sizes(model, optimizer)
        setup_s = time.perf_counter() - began
        writer = None
        if method != "gathered":
            placeholder = CheckpointDir(Path(args.tmp) / "unused")  # each save points it at its own directory
            writer = ShardedCheckpointWriter(
                placeholder,
                is_main=rank == 0,
                asynchronous=method == "dcp-async",
                device=Device("cpu"),
            )
        saves = [save_once(method, model, optimizer, writer, step, args) for step in range(args.trials + 1)]
        if writer is not None:
            writer.close()
        if rank == 0:
            record = {
                "world_size": world_size,
                "method": method,
                "parameters": parameters,
                "own_state_bytes": own,
                "full_state_bytes": full,
                "setup_s": setup_s,
                "warmup": saves[0],
                "trials": saves[1:],
            }
            Path(out).write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()


def run_case(world_size: int, method: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(dir=args.tmp) as scratch:
        out = str(Path(scratch) / "rank0.json")
        began = time.perf_counter()
        mp.start_processes(
            rank_main,
            args=(world_size, method, free_port(), args, out),
            nprocs=world_size,
            start_method="spawn",
        )
        record = json.loads(Path(out).read_text())
    record["wall_s"] = time.perf_counter() - began
    return summarize(record)


def summarize(case: dict[str, Any]) -> dict[str, Any]:
    """The trials' intervals. Memory two ways: the peak over the RSS just before each save, and over the RSS
    before the first (warm-up) save, which also counts what earlier saves left allocated (the allocator keeps
    freed memory for reuse, so a later save's own increase can look small while the process stays larger)."""
    trials, first = case["trials"], case["warmup"]["rss_before_bytes"]
    case["blocked_interval"] = interval([t["blocked_s"] for t in trials])
    case["blocked_max_interval"] = interval([t["blocked_max_s"] for t in trials])
    if case["method"] == "dcp-async":
        case["written_interval"] = interval([t["written_s"] for t in trials])
    case["peak_increase_interval"] = interval([t["peak_increase_bytes"] / MIB for t in trials])
    above = [t["rss_before_bytes"] + t["peak_increase_bytes"] - first for t in trials]
    case["peak_above_first_interval"] = interval([a / MIB for a in above])
    # The largest peak of the run over the RSS before its first save, the warm-up's own peak included.
    case["peak_above_first_max_bytes"] = max([case["warmup"]["peak_increase_bytes"], *above])
    return case


def interval(values: list[float]) -> dict[str, float]:
    found = mean_interval(values)
    return {
        "mean": found.mean,
        "low": found.low,
        "high": found.high,
        "trials": found.trials,
    }


# --------------------------------------------------------------------------------------------- reporting


def _span(found: dict[str, float], digits: int = 2) -> str:
    return f"{found['mean']:.{digits}f} ({found['low']:.{digits}f} to {found['high']:.{digits}f})"


def _cases(record: dict[str, Any], world_size: int) -> dict[str, dict[str, Any]]:
    return {c["method"]: c for c in record["cases"] if c["world_size"] == world_size}


def targets(record: dict[str, Any]) -> list[str]:
    """The issue's two targets, one yes/no line per world size (and per method for memory)."""
    lines = [
        "## Targets",
        "",
        "Async: blocked time of `dcp-async` (staging only) against `gathered`, means over the trials.",
        "",
    ]
    for size in record["world_sizes"]:
        cases = _cases(record, size)
        if "gathered" in cases and "dcp-async" in cases:
            asynchronous = cases["dcp-async"]["blocked_interval"]["mean"]
            ratio = asynchronous / cases["gathered"]["blocked_interval"]["mean"]
            verdict = "yes" if ratio < 0.10 else "no"
            lines.append(
                f"- {size} ranks: async blocks the loop for under 10 % of the gathered save's time: "
                f"**{verdict}** ({100 * ratio:.1f} %)"
            )
    lines += [
        "",
        "Memory: rank 0's own shard state plus a bounded staging buffer (for async one copy of its shards) is "
        "an increase of at most 2x its own shards; judged on the largest peak of any save (warm-up included) "
        "over the RSS before the first save, so that memory an earlier save left allocated counts too.",
        "",
    ]
    for size in record["world_sizes"]:
        for method, case in _cases(record, size).items():
            own, full = case["own_state_bytes"], case["full_state_bytes"]
            worst = case["peak_above_first_max_bytes"]
            verdict = "yes" if worst <= 2 * own else "no"
            lines.append(
                f"- {size} ranks, {method}: rank 0's peak host memory during a save is no more than its own "
                f"shard's state plus a bounded staging buffer: **{verdict}** (largest increase {mib(worst)} MiB "
                f"= {worst / own:.2f}x its own shards of {mib(own)} MiB, {worst / full:.2f}x the full state "
                f"of {mib(full)} MiB)"
            )
    return lines


def markdown(record: dict[str, Any]) -> str:
    """The record as the committed Markdown report."""
    first = record["cases"][0]
    model = record["model"]
    moments = "zero gradients" if model["zero_grads"] else "one forward/backward step on a random batch"
    lines = [
        f"# Checkpoint save: time the loop is blocked and rank 0's peak memory ({record['device']})",
        "",
        f"- date: {record['date']}; torch {record['torch']}; {record['platform']}",
        f"- command: `{record['command']}`",
        f"- model: ViT embed {model['embed']}, depth {model['depth']}, {model['heads']} heads, patch "
        f"{model['patch']}, {model['height']}x{model['width']} grid, {model['channels']} channels: "
        f"{first['parameters']:,} parameters, FSDP2 (`shard_fully` over the blocks) on gloo; Adam's moments "
        f"from {moments}; full state (weights + 2 moments) {mib(first['full_state_bytes'])} MiB",
        f"- {record['trials']} timed saves per (world size, method), each (world size, method) in fresh processes, "
        "after one warm-up save that is not in the means (its own column); means with 95 % intervals over the "
        "trials; every save into a fresh directory under /tmp, removed after it",
        "- blocked: rank 0's wall time of the save (gathered: gather, rank 0's write, barrier; dcp-sync: `save`, "
        "barrier; dcp-async: `save` until it returns), and the max over ranks; written after: async until "
        "`finish` returned",
        "- memory: before each save every rank calls glibc's `malloc_trim(0)` (the RSS before is then memory in "
        "use, not freed memory the allocator keeps and a save would reuse unseen); rank 0's VmRSS sampled every "
        f"{record['sample_ms']:g} ms during the save (until `finish` for "
        "async); the peak over the RSS just before that save, and over the RSS before the run's first save",
        f"- noise: the machine has {record['cores']} cores and every rank runs one thread, so 4 and 8 ranks are "
        "oversubscribed (2 and 4 ranks per core): collectives, staging and writes of different ranks compete for "
        f"the cores, and times scatter more than the intervals of {record['trials']} trials show. Writes go to one "
        "local disk (the page cache takes them; each save syncs its files)",
        "",
    ]
    for size in record["world_sizes"]:
        cases = _cases(record, size)
        own = next(iter(cases.values()))["own_state_bytes"]
        lines += [
            f"## {size} ranks (rank 0's own shards: {mib(own)} MiB)",
            "",
            "| method | blocked s, rank 0 | blocked s, max over ranks | written after s | peak over RSS before "
            "the save, MiB | peak over RSS before the first save, MiB | / own shards | warm-up: blocked s, "
            "peak MiB |",
            "|---|---|---|---|---|---|---:|---|",
        ]
        for method, case in cases.items():
            written = _span(case["written_interval"]) if "written_interval" in case else "= blocked"
            above = case["peak_above_first_interval"]
            warmup = case["warmup"]
            lines.append(
                f"| {method} | {_span(case['blocked_interval'])} | {_span(case['blocked_max_interval'])} | "
                f"{written} | {_span(case['peak_increase_interval'], 0)} | {_span(above, 0)} | "
                f"{above['mean'] * MIB / own:.2f} | {warmup['blocked_s']:.2f}, "
                f"{warmup['peak_increase_bytes'] / MIB:.0f} |"
            )
        lines.append("")
    lines += targets(record)
    meaning = record.get("meaning")
    if meaning:
        lines += ["", "## What this means", "", meaning]
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: Path) -> None:
    """Blocked seconds per save and rank 0's peak memory increase against world size, per method."""
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = figure.subplots(1, 2)
    for method in record["methods"]:
        cases = [c for c in record["cases"] if c["method"] == method]
        sizes = [c["world_size"] for c in cases]
        for axis, key in (
            (left, "blocked_interval"),
            (right, "peak_above_first_interval"),
        ):
            found = [c[key] for c in cases]
            errors = [
                [f["mean"] - f["low"] for f in found],
                [f["high"] - f["mean"] for f in found],
            ]
            axis.errorbar(
                sizes,
                [f["mean"] for f in found],
                yerr=errors,
                marker="o",
                capsize=4,
                label=method,
            )
        if method == "dcp-async":
            found = [c["written_interval"] for c in cases]
            left.plot(
                sizes,
                [f["mean"] for f in found],
                ls=":",
                marker="x",
                color="grey",
                label="dcp-async, until written",
            )
    sizes = sorted(record["world_sizes"])
    owns = [_cases(record, s)[record["methods"][0]]["own_state_bytes"] / MIB for s in sizes]
    right.plot(
        sizes,
        [2 * o for o in owns],
        ls="--",
        color="black",
        label="2x rank 0's own shards",
    )
    right.plot(sizes, owns, ls=":", color="black", label="rank 0's own shards")
    right.axhline(
        record["cases"][0]["full_state_bytes"] / MIB,
        ls="-.",
        color="red",
        label="full state",
    )
    left.set_yscale("log")
    left.set_ylabel("seconds the loop is blocked per save")
    left.set_title("blocked time per save (log scale)", fontsize="medium")
    right.set_ylabel("MiB over the RSS before the first save")
    right.set_title("rank 0's peak host memory during a save", fontsize="medium")
    right.set_ylim(0, 1.6 * record["cases"][0]["full_state_bytes"] / MIB)  # room for the legend above
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(sizes, [str(s) for s in sizes])
        axis.set_xlabel("ranks (CPU, gloo)")
        axis.grid(alpha=0.3)
        axis.legend(
            fontsize="small",
            loc="upper left" if axis is left else "upper right",
            ncol=1 if axis is left else 2,
        )
    figure.suptitle(
        f"Checkpoint save, {record['cases'][0]['parameters'] / 1e6:.3g}M-parameter ViT + Adam, FSDP2, "
        f"{record['device']} (means, 95% CI over {record['trials']} trials)",
        fontsize="medium",
    )
    figure.savefig(path, dpi=120)


def write_results(record: dict[str, Any], out: Path) -> None:
    quick = "-quick" if record.get("quick") else ""  # a smoke test never replaces a real run's record
    stem = out / f"{record['date']}-cpu-checkpoint-save{quick}"
    write_text_atomically(stem.with_suffix(".json"), json.dumps(record, indent=2) + "\n")
    write_text_atomically(stem.with_suffix(".md"), markdown(record))
    plot(record, stem.with_suffix(".png"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:  # the report again from a run's record (e.g. with a "meaning" paragraph added)
        record = json.loads(Path(args.from_json).read_text())
        record["cases"] = [summarize(case) for case in record["cases"]]
        write_results(record, Path(args.out))
        print(markdown(record))
        return 0
    os.environ["OMP_NUM_THREADS"] = "1"
    cases = []
    for size in args.world_sizes:
        for method in args.methods:
            case = run_case(size, method, args)
            print(
                f"{size} ranks, {method}: {case['parameters']:,} parameters, blocked "
                f"{_span(case['blocked_interval'])} s, peak over the first save's RSS "
                f"{_span(case['peak_above_first_interval'], 0)} MiB (own shards "
                f"{mib(case['own_state_bytes'])} MiB), {case['wall_s']:.0f} s in all",
                flush=True,
            )
            cases.append(case)
    cores = os.cpu_count() or 0
    record = {
        "device": f"cpu-{cores}-cores",
        "date": datetime.now().strftime("%Y-%m-%d"),
        "torch": str(torch.__version__),
        "platform": platform.platform(),
        "command": command_line("benchmarks/checkpoint_save.py", argv if argv is not None else sys.argv[1:]),
        "cores": cores,
        "quick": args.quick,
        "model": {key: getattr(args, key) for key in (*QUICK, "zero_grads")},
        "world_sizes": args.world_sizes,
        "methods": args.methods,
        "trials": args.trials,
        "sample_ms": args.sample_ms,
        "cases": cases,
    }
    write_results(record, Path(args.out))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
