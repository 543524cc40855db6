"""``dlscale.load_model``: an exported model back as a plain torch module, with what normalizes its inputs and
denormalizes its outputs.

Every file is checked against the manifest's sha256 first, so a changed, damaged or half-copied export is
refused with the file's name before anything is built. Nothing is unpickled: the weights are safetensors, the
statistics ``.npy`` arrays read with ``allow_pickle=False``, the config YAML read by the safe loader. The model is
built by the workload's ``build_model`` (so the workload must be importable here: a built-in one, or the
user's package), then the weights are loaded strictly. The ``torch.export`` program (``model.pt2``) is for places
without dlscale, and not read here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlscale.checkpoint.files import load_model_state
from dlscale.config import load_run_config
from dlscale.data.values.npy_files import read_npy_array
from dlscale.errors import ExportError
from dlscale.exported.layout import CONFIG_FILE, WEIGHTS_FILE, read_manifest, verify_files
from dlscale.workloads import get_workload


@dataclass(frozen=True)
class ExportedModel:
    """A model exported by ``dlscale export``, loaded by :func:`dlscale.load_model`.

    Attributes:
        model: the plain torch module (the workload's ``build_model``), in eval mode, on the CPU.
        config: the run's resolved config, every section as plain values (``RunConfig.to_dict()``).
        workload: the workload's name (``era5_vit``, ``cnn_mnist``, ...).
        stats: the normalization statistics by name (float32 numpy arrays): ``input_mean``, ``input_std``,
            ``output_mean``, ``output_std`` where the workload has them (empty for data the model reads as it is).
        manifest: ``manifest.json``: versions, the source checkpoint and its ``global_step``, ``input`` and
            ``output`` shapes of one sample, the sha256 of each file.
        directory: where the export is.

    ``model(exported.normalize(x))`` predicts from raw inputs ``x`` (a batch, in the data's own units), and
    ``exported.denormalize(y)`` gives predictions ``y`` back in those units.
    """

    model: torch.nn.Module = field(repr=False)
    config: dict[str, Any] = field(repr=False)
    workload: str
    stats: dict[str, np.ndarray] = field(repr=False)
    manifest: dict[str, Any] = field(repr=False)
    directory: Path

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one input sample (a batch adds a first dimension)."""
        return tuple(self.manifest["input"]["shape"])

    @property
    def output_shape(self) -> tuple[int, ...]:
        """The shape of one output sample."""
        return tuple(self.manifest["output"]["shape"])

    def normalize(self, inputs: Any) -> torch.Tensor:
        """``(inputs - input_mean) / input_std``, as the training data was normalized (bitwise the same values in
        float32); ``inputs`` as a float tensor when the workload has no such statistics."""
        return _affine(inputs, self.stats.get("input_mean"), self.stats.get("input_std"), inverse=False)

    def denormalize(self, outputs: Any) -> torch.Tensor:
        """``outputs * output_std + output_mean``: predictions in the data's own units (e.g. ERA5 fields in K and
        m/s); ``outputs`` itself when the workload has no such statistics (logits of a classifier)."""
        return _affine(outputs, self.stats.get("output_mean"), self.stats.get("output_std"), inverse=True)


def load_model(directory: str | Path) -> ExportedModel:
    """The model that ``dlscale export`` wrote to ``directory``, after checking every file's sha256.

    Raises :class:`dlscale.errors.ExportError` naming the file when the directory is not an export, a file is
    missing or changed; a CheckpointError when the weights do not fit the model that the config builds.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory).expanduser()
    manifest = read_manifest(directory)
    verify_files(directory, manifest)
    cfg = load_run_config(directory / CONFIG_FILE, manifest.get("config_name", ""))
    workload = get_workload(cfg.workload).configured(cfg.model, cfg.data)
    model = workload.build_model(cfg.model, cfg.data)
    weights = directory / WEIGHTS_FILE
    try:
        state = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise ExportError(f"{weights}: cannot be read as safetensors ({exc})") from None
    load_model_state(model, state, str(weights))
    model.eval()
    stats = {
        name: read_npy_array(directory / relative, f"the normalization statistic {name!r} of the export")
        for name, relative in manifest.get("normalization", {}).items()
    }
    return ExportedModel(model, cfg.to_dict(), cfg.workload, stats, manifest, directory)


def _affine(values: Any, mean: np.ndarray | None, std: np.ndarray | None, inverse: bool) -> torch.Tensor:
    tensor = torch.as_tensor(values)
    if not tensor.is_floating_point():
        tensor = tensor.to(torch.float32)
    if mean is None or std is None:
        return tensor
    mean_t = torch.as_tensor(mean, device=tensor.device)
    std_t = torch.as_tensor(std, device=tensor.device)
    return tensor * std_t + mean_t if inverse else (tensor - mean_t) / std_t
