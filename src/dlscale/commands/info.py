"""``dlscale config`` (show a resolved config or every key) and ``dlscale info`` (versions, device)."""

from __future__ import annotations

import argparse
import platform
from typing import TYPE_CHECKING

from dlscale.commands.flags import config_flag_values
from dlscale.config import config_reference, load_run_config
from dlscale.version import __version__

if TYPE_CHECKING:
    from dlscale.runtime.device import Device


def run_config(args: argparse.Namespace) -> int:
    if args.keys and args.workload is not None:
        print(config_reference(args.workload))
        return 0
    cfg = load_run_config(args.yaml_config, args.config, args.set, config_flag_values(args))
    if args.keys:
        print(config_reference(cfg.workload))
        return 0
    print(cfg.to_yaml(), end="")
    return 0


def device_description(device: Device) -> str:
    """'cuda:0 (NVIDIA H100 80GB HBM3)' on a GPU, 'cpu (2 threads)' on the CPU (whose name already says cpu)."""
    return f"{device.torch} ({device.name})" if device.is_gpu else device.name


def run_info(args: argparse.Namespace) -> int:
    import h5py
    import numpy
    import torch

    from dlscale.runtime.device import Device

    device = Device.select()
    print(f"dlscale {__version__}")
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, numpy {numpy.__version__}, h5py {h5py.__version__}"
    )
    print(f"device: {device_description(device)}")
    print(
        f"CUDA available: {torch.cuda.is_available()}; distributed available: {torch.distributed.is_available()}"
    )
    return 0
