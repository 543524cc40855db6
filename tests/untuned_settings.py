"""The tunable settings of an untuned config (pytorch loader, no workers, fp32, nothing compiled), for the
tune's tests: the knobs' and the climb's."""

from __future__ import annotations

from typing import Any

from dlscale.tuning.knobs import BATCH_KEY, SETTING_KEYS

UNTUNED: dict[str, Any] = {
    "loader.num_data_workers": 0,
    "loader.persistent_workers": False,
    "loader.prefetch_factor": None,
    "loader.pin_memory": None,
    "loader.data_loader_config": "pytorch",
    "loader.prefetch_depth": 2,
    "loader.device_prefetch": False,
    "optim.optimizer": "AdamW",
    "optim.enable_fused": False,
    "train.amp_mode": "none",
    "train.tf32": False,
    "train.enable_jit": False,
    "train.compile_mode": "default",
    "train.cuda_graphs": False,
    "train.on_nonfinite": "stop",
    BATCH_KEY: 16,
    "parallel.bucket_cap_mb": 25.0,
    "parallel.disable_broadcast_buffers": False,
    "parallel.gradient_as_bucket_view": False,
}
assert set(UNTUNED) == set(SETTING_KEYS)
