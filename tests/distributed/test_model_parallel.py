"""Tensor and context parallelism on CPU with gloo: every layout computes exactly what the serial ViT computes.

For each layout the forward output, the loss and every parameter's gradient equal the serial model's within 1e-5
(relative to the tensor's largest entry), all weights still match after 5 Adam steps, and replicated weights are
bitwise identical on every rank. Then whole training runs: tp=2 x cp=2 on 4 ranks gives the serial loss curve,
and a checkpoint written by one layout continues under another.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from forked_ranks import run_ranks
from model_parallel_ranks import saved_activation_bytes, train_side_by_side
from test_data_parallel import StopAtStep, assert_close_weights, checkpoint, tiny

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.config import load_run_config
from dlscale.run.training import train
from dlscale.workloads import get_workload

TOLERANCE = 1e-5
# Weights after 5 Adam steps: Adam divides each update by the root of its second moment, so a rounding
# difference of the gradients well inside TOLERANCE can move a weight near zero (a bias) by a few 1e-5 of its
# size (2.4e-5 for blocks.0.attn.v.bias with torch 2.11's CPU kernels, under 1e-5 with torch 2.13's).
WEIGHT_TOLERANCE = 1e-4

# world size, tp, cp, order, image (H, W), patch: tokens = (H / patch) x (W / patch)
LAYOUTS = {
    "tp2": (2, 2, 1, "tp-cp-dp", (16, 32), 4),
    "cp2": (2, 1, 2, "tp-cp-dp", (16, 32), 4),
    "tp2xcp2": (4, 2, 2, "tp-cp-dp", (16, 32), 4),
    "tp2xdp2": (4, 2, 1, "tp-cp-dp", (16, 32), 4),
    "cp4-uneven-45-tokens": (4, 1, 4, "tp-cp-dp", (20, 36), 4),
    "tp2xcp2-order-cp-tp-dp": (4, 2, 2, "cp-tp-dp", (16, 32), 4),
}


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30))


def is_key_bias(name: str) -> bool:
    # Softmax ignores what a key bias adds (the same q.b for every key of a query), so its gradient is
    # mathematically zero: both models give rounding noise there, which Adam then normalizes to full-size
    # updates. It is checked to be noise instead of compared.
    return name.endswith("attn.k.bias")


def check_against_serial(results: list[dict], what: str) -> None:
    for rank, result in enumerate(results):
        output, serial_output = result["output"]
        assert relative_error(output, serial_output) < TOLERANCE, f"{what}: output on rank {rank}"
        loss, serial_loss = result["loss"]
        assert loss == pytest.approx(serial_loss, rel=TOLERANCE), f"{what}: loss on rank {rank}"
        scale = max(np.abs(g).max() for _, g in result["grads"].values())
        for name, (grad, serial_grad) in result["grads"].items():
            if is_key_bias(name):
                assert np.abs(serial_grad).max() < 1e-6 * scale and np.abs(grad).max() < 1e-6 * scale, name
                continue
            assert relative_error(grad, serial_grad) < TOLERANCE, f"{what}: gradient of {name} on rank {rank}"
        for name, (weight, serial_weight) in result["weights"].items():
            if not is_key_bias(name):
                error = relative_error(weight, serial_weight)
                assert error < WEIGHT_TOLERANCE, f"{what}: {name} after 5 steps on rank {rank} ({error:.2e})"


def check_replicas(results: list[dict], what: str) -> None:
    """Parameters that are not sharded are the same bits on every rank; shards differ between tp ranks."""
    first = results[0]["local"]
    for result in results[1:]:
        for name, value in result["local"].items():
            if (
                value.shape == first[name].shape
                and result["coordinates"]["tp"] == results[0]["coordinates"]["tp"]
            ):
                assert np.array_equal(value, first[name]), f"{what}: {name} differs between replicas"
    for name in (
        "pos_embed",
        "norm.weight",
        "blocks.0.norm1.weight",
        "blocks.1.attn.proj.bias",
        "head.weight",
    ):
        assert all(np.array_equal(r["local"][name], first[name]) for r in results), f"{what}: {name}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_parallel_vit_equals_the_serial_vit(layout):
    world, tp, cp, order, img_size, patch = LAYOUTS[layout]
    results = run_ranks(world, train_side_by_side, tp, cp, order, img_size, 2, 5, patch)
    check_against_serial(results, layout)
    check_replicas(results, layout)
    if tp > 1:
        shard = "blocks.0.mlp.fc1.weight"
        assert results[0]["local"][shard].shape[0] * tp == results[0]["weights"][shard][1].shape[0]
    if layout.startswith("cp4-uneven"):
        assert results[0]["token_sizes"] == [12, 11, 11, 11]


def test_gradient_clipping_uses_the_serial_norm():
    results = run_ranks(4, train_side_by_side, 2, 2, "tp-cp-dp", (16, 32), 2, 3, 4, 0.05)
    check_against_serial(results, "clipped at 0.05")


@pytest.mark.parametrize("amp", ["none", "bf16"])
def test_dlscale_plan_activation_estimate_matches_the_busiest_real_rank(amp):
    # 66 tokens over cp=2; the first tp rank of the first cp chunk is the busiest (dlscale plan estimates it).
    results = run_ranks(4, saved_activation_bytes, 2, 2, (24, 44), 2, amp)
    measured, estimated = results[0]
    assert measured == pytest.approx(estimated, rel=0.01)
    assert max(m for m, _ in results) == measured


# ----------------------------------------------------------------------------------------- training runs


def train_layout(
    rank: int, data: Path, expdir: Path, overrides: tuple[str, ...], stop_step: int | None = None
) -> int:
    observers = [StopAtStep(stop_step)] if stop_step is not None else []
    return train(tiny(data, expdir, *overrides), extra_observers=observers)


def history(expdir: Path) -> list[dict]:
    return checkpoint(expdir)["progress"]["history"]


def model_weights(expdir: Path) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in checkpoint(expdir)["model"].items()}


def parameters_in_layout_table(log_text: str) -> dict[int, int]:
    """{rank: parameters} from the layout table in a run's log."""
    rows = {}
    for line in log_text.splitlines():
        fields = line.split(" - INFO - ")[-1].split()
        if len(fields) == 5 and all(f.replace(",", "").isdigit() for f in fields):
            rows[int(fields[0])] = int(fields[4].replace(",", ""))
    return rows


@pytest.mark.slow
def test_tp2_cp2_training_follows_the_serial_loss_curve_and_resumes_in_another_layout(tiny_era5, tmp_path):
    serial = tmp_path / "serial"
    train(tiny(tiny_era5, serial, "log.tensorboard=false"))  # 2 epochs on one process
    expected = history(serial)

    parallel = tmp_path / "tp2xcp2"
    mp = ("log.tensorboard=false", "parallel.tensor_parallel=2", "parallel.context_parallel=2")
    assert run_ranks(4, train_layout, tiny_era5, parallel, mp) == [0, 0, 0, 0]
    saved = checkpoint(parallel)
    assert saved["meta"]["layout"].startswith("dp=1 x tp=2 x cp=2")
    log_text = (parallel / "tiny" / "00" / "out.log").read_text()
    assert "Parallel layout: dp=1 x tp=2 x cp=2 (order tp-cp-dp), 4 rank(s)" in log_text
    assert "tp groups: {0,1} {2,3}" in log_text and "cp groups: {0,2} {1,3}" in log_text
    assert "Scaffolding memory high watermark: " in log_text
    assert log_text.count(" Memory usage after forward pass: ") == 2  # the first step of each epoch
    table = parameters_in_layout_table(log_text)
    serial_total = sum(v.numel() for v in checkpoint(serial)["model"].values())
    assert len(table) == 4 and serial_total / 2 < table[0] < serial_total  # tp halves the blocks' matmuls
    # The checkpoint holds the serial model's shapes: it loads into the plain ViT.
    assert_close_weights(model_weights(serial), model_weights(parallel), "tp2 x cp2 vs serial")
    for serial_row, parallel_row in zip(expected, history(parallel), strict=True):
        assert parallel_row["train_loss"] == pytest.approx(serial_row["train_loss"], rel=TOLERANCE)
        assert parallel_row["val_loss"] == pytest.approx(serial_row["val_loss"], rel=TOLERANCE)

    # Stopped in the middle of the first epoch with tp=2 x cp=2, continued on tp=2 x dp=2 from that checkpoint.
    switched = tmp_path / "switched"
    assert run_ranks(4, train_layout, tiny_era5, switched, (*mp, "parallel.stop_check_every=1"), 5) == [0] * 4
    assert checkpoint(switched)["progress"]["global_step"] == 5
    second = ("log.tensorboard=false", "parallel.tensor_parallel=2", "parallel.parallel_order=dp-tp-cp")
    assert run_ranks(4, train_layout, tiny_era5, switched, second) == [0, 0, 0, 0]
    resumed = checkpoint(switched)
    assert resumed["progress"]["completed"] and resumed["meta"]["layout"].startswith("dp=2 x tp=2 x cp=1")
    assert_close_weights(model_weights(serial), model_weights(switched), "resumed with another layout")
    assert [row["val_loss"] for row in history(switched)] == pytest.approx(
        [row["val_loss"] for row in expected], rel=TOLERANCE
    )


@pytest.mark.slow
def test_fsdp_shards_what_tp_leaves_whole_and_trains_like_serial(tiny_era5, tmp_path):
    serial = tmp_path / "serial"
    train(tiny(tiny_era5, serial, "log.tensorboard=false"))
    # FSDP2 over dp=2 x cp=2, stopped at step 5; continued as FSDP2 over dp=2 with tp=2.
    expdir = tmp_path / "fsdp"
    first = ("log.tensorboard=false", "parallel.data_parallel=fsdp", "parallel.context_parallel=2")
    assert (
        run_ranks(4, train_layout, tiny_era5, expdir, (*first, "parallel.stop_check_every=1"), 5) == [0] * 4
    )
    table = parameters_in_layout_table((expdir / "tiny" / "00" / "out.log").read_text())
    total = sum(v.numel() for v in checkpoint(serial)["model"].values())
    # The ranks hold the model once between them, about a quarter each (FSDP2 shards each tensor's first
    # dimension; a tensor with a leading 1, like pos_embed, stays whole on one rank).
    assert sum(table.values()) == total and max(table.values()) < total / 4 * 1.2, table
    second = ("log.tensorboard=false", "parallel.data_parallel=fsdp", "parallel.tensor_parallel=2")
    assert run_ranks(4, train_layout, tiny_era5, expdir, second) == [0] * 4
    resumed = checkpoint(expdir)
    assert resumed["progress"]["completed"] and resumed["meta"]["layout"].startswith("dp=2 x tp=2 x cp=1")
    assert_close_weights(model_weights(serial), model_weights(expdir), "FSDP2 runs vs serial")
    assert [row["val_loss"] for row in history(expdir)] == pytest.approx(
        [row["val_loss"] for row in history(serial)], rel=TOLERANCE
    )


@pytest.mark.slow
def test_a_tp2_checkpoint_in_one_file_holds_the_serial_adam_moments(tiny_era5, tmp_path):
    """tp defaults to sharded checkpoints; ``checkpoint.format: file`` gathers each shard's Adam moments to the
    serial shape, as the serial run's optimizer holds them (two steps: 8 samples in batches of 4)."""
    short = (
        "log.tensorboard=false", "checkpoint.format=file",
        "data.limit_nsamples=8", "data.limit_nsamples_val=4", "train.num_epochs=1",
    )  # fmt: skip
    serial, parallel = tmp_path / "serial", tmp_path / "tp2"
    train(tiny(tiny_era5, serial, *short))
    assert run_ranks(2, train_layout, tiny_era5, parallel, (*short, "parallel.tensor_parallel=2")) == [0, 0]
    assert CheckpointDir(parallel / "tiny" / "00" / "checkpoints").latest_path.name == "ckpt_latest.pt"
    expected, actual = checkpoint(serial)["optimizer"]["state"], checkpoint(parallel)["optimizer"]["state"]
    cfg = load_run_config(serial / "tiny" / "00" / "config.yaml", "tiny")
    names = [
        name for name, _ in get_workload(cfg.workload).build_model(cfg.model, cfg.data).named_parameters()
    ]
    assert sorted(actual) == sorted(expected) == list(range(len(names)))
    for index, name in enumerate(names):
        for moment in ("exp_avg", "exp_avg_sq"):
            serial_moment, gathered = expected[index][moment].numpy(), actual[index][moment].numpy()
            assert gathered.shape == serial_moment.shape, f"{moment} of {name}"
            if not is_key_bias(name):
                # Averages of the gradients (within TOLERANCE of the serial ones) and of their squares (twice it).
                error = relative_error(gathered, serial_moment)
                assert error < 2 * TOLERANCE, f"{moment} of {name}: {error:.2e}"


def refusal(rank: int, tp: int, cp: int, img_size: tuple[int, int], heads: int, dropout: float) -> str:
    from model_parallel_ranks import start_mesh

    from dlscale.errors import ConfigError
    from dlscale.models.vit import VisionTransformer
    from dlscale.models.vit_config import ViTConfig
    from dlscale.parallel.vit_parallel import parallelize_vit
    from dlscale.runtime.distributed import stop_process_group

    mesh, _ = start_mesh(tp, cp, "tp-cp-dp")
    try:
        cfg = ViTConfig(embed_dim=48, depth=1, num_heads=heads, patch_size=4, dropout=dropout)
        parallelize_vit(VisionTransformer(cfg, img_size, 3, 3), mesh)
        return ""
    except ConfigError as error:
        return str(error)
    finally:
        stop_process_group()


@pytest.mark.parametrize(
    ("tp", "cp", "img_size", "heads", "dropout", "fragments"),
    [
        (2, 1, (8, 8), 3, 0.0, ["tensor_parallel 2", "3 attention heads", "[1, 3]"]),
        (1, 2, (4, 4), 4, 0.0, ["context_parallel 2", "only 1 tokens"]),
        (2, 1, (8, 8), 4, 0.1, ["model.dropout", "set dropout: 0"]),
    ],
)
def test_layouts_the_vit_cannot_take_are_refused_by_name(tp, cp, img_size, heads, dropout, fragments):
    messages = run_ranks(tp * cp, refusal, tp, cp, img_size, heads, dropout)
    for message in messages:
        for fragment in fragments:
            assert fragment in message, message
