"""The ViT's ``model:`` config section: its shape and token mixer, independent of the data (no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from dlscale.errors import InvalidValue

# What mixes information between tokens in every block: the tutorial's global self-attention, or FourCastNet's
# adaptive Fourier neural operator (dlscale.models.afno). A new mixer is one more name here and in the `mixer`
# field's Literal, and one more branch in dlscale.models.vit.build_block.
MIXERS = ("attention", "afno", "sfno")
# More noise channels than this is more noise than state (the demo's state has 20 channels, ERA5's up to ~70).
MAX_NOISE_CHANNELS = 64


@dataclass
class ViTConfig:
    """The `model:` section of a run config: the shape of the ViT, independent of the data."""

    # width of every token (the transformer's hidden size D)
    embed_dim: int = 384
    # number of transformer blocks
    depth: int = 12
    # attention heads per block; embed_dim must be a multiple of it
    num_heads: int = 8
    # side of the square patch that becomes one token; must divide both image sides
    patch_size: int = 8
    # MLP hidden width as a multiple of embed_dim
    mlp_ratio: float = 4.0
    # token dropout, attention dropout and the largest drop-path rate at once, as in the reference
    dropout: float = 0.0
    # whether q, k and v carry a bias (proj always does)
    qkv_bias: bool = True
    # epsilon of every LayerNorm
    norm_eps: float = 1e-6
    # the token mixer of every block: attention (the tutorial's ViT), afno (FourCastNet v1's AFNO filter) or sfno
    # (the spherical Fourier neural operator's convolution, on the patch grid's latitudes)
    mixer: Literal["attention", "afno", "sfno"] = "attention"
    # afno: the channels split into this many blocks, each with its own complex 2-layer MLP (divides embed_dim)
    afno_num_blocks: int = 8
    # afno: soft shrinkage of the filtered spectrum's real and imaginary parts (0: none)
    afno_sparsity_threshold: float = 0.01
    # afno: the fraction of Fourier modes the filter acts on, selected as FourCastNet does, in (0, 1]
    afno_hard_thresholding_fraction: float = 1.0
    # sfno: the channels split into this many blocks, each with its own complex matrix per degree (divides
    # embed_dim; fewer blocks mean embed_dim^2 / sfno_num_blocks parameters per degree and block)
    sfno_num_blocks: int = 8
    # channels of Gaussian noise the model reads beside the state (0: none, a deterministic model): a stochastic
    # model whose members differ by their noise, trained as an ensemble by train.loss: crps (FourCastNet 3's
    # noise inputs; dlscale.training.ensemble_loss)
    noise_channels: int = 0

    # Keys a resumed run may change: they do not change what the saved weights mean (see resume.py).
    RESUME_SAFE_KEYS: ClassVar[tuple[str, ...]] = ("dropout",)

    def __post_init__(self) -> None:
        for name in ("embed_dim", "depth", "num_heads", "patch_size", "afno_num_blocks", "sfno_num_blocks"):
            value = getattr(self, name)
            if value < 1:
                raise InvalidValue(name, f"must be at least 1, got {value}")
        if self.mixer not in MIXERS:
            raise InvalidValue("mixer", f"{self.mixer!r} is not one of {', '.join(MIXERS)}")
        # num_heads only shapes attention: an AFNO model's width need not be a multiple of it.
        if self.mixer == "attention" and self.embed_dim % self.num_heads != 0:
            raise InvalidValue(
                "embed_dim",
                f"{self.embed_dim} is not a multiple of num_heads={self.num_heads} "
                f"(it would need a head dim of {self.embed_dim / self.num_heads:g}); "
                f"use a multiple of {self.num_heads}, e.g. {self.num_heads * max(1, self.embed_dim // self.num_heads)}",
            )
        if not 0.0 <= self.dropout < 1.0:
            raise InvalidValue("dropout", f"must be in [0, 1), got {self.dropout}")
        if not (self.mlp_ratio > 0 and math.isfinite(self.mlp_ratio)):
            raise InvalidValue("mlp_ratio", f"must be a finite number > 0, got {self.mlp_ratio}")
        hidden = self.mlp_ratio * self.embed_dim
        # A fractional width would be truncated silently; refuse it so the model is what the config says.
        if hidden < 1 or hidden != int(hidden):
            raise InvalidValue(
                "mlp_ratio",
                f"mlp_ratio * embed_dim = {self.mlp_ratio} * {self.embed_dim} = {hidden:g} "
                "must be a whole number of at least 1 (the MLP hidden width)",
            )
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise InvalidValue("norm_eps", f"must be a finite number > 0, got {self.norm_eps}")
        if not 0 <= self.noise_channels <= MAX_NOISE_CHANNELS:
            raise InvalidValue(
                "noise_channels",
                f"must be 0 (a deterministic model) to {MAX_NOISE_CHANNELS} channels of noise, got "
                f"{self.noise_channels}",
            )
        self._check_afno()

    def _check_afno(self) -> None:
        """The AFNO keys' ranges always (a wrong value is wrong whatever the mixer), their fit to the width
        only for the AFNO mixer."""
        threshold = self.afno_sparsity_threshold
        if not (threshold >= 0 and math.isfinite(threshold)):
            raise InvalidValue("afno_sparsity_threshold", f"must be a finite number >= 0, got {threshold}")
        fraction = self.afno_hard_thresholding_fraction
        if not 0 < fraction <= 1:  # NaN fails too
            raise InvalidValue(
                "afno_hard_thresholding_fraction",
                f"must be in (0, 1], the fraction of Fourier modes the filter keeps, got {fraction}",
            )
        for mixer in ("afno", "sfno"):
            key = f"{mixer}_num_blocks"
            blocks = getattr(self, key)
            if self.mixer == mixer and self.embed_dim % blocks != 0:
                fitting = [d for d in range(1, self.embed_dim + 1) if self.embed_dim % d == 0 and d <= 64]
                raise InvalidValue(
                    key,
                    f"{blocks} blocks do not divide embed_dim {self.embed_dim} (each block is "
                    f"embed_dim / {key} channels wide); use one of {fitting}",
                )

    def check_parallel(self, tensor_parallel: int, context_parallel: int) -> None:
        """Refuse a tensor- or context-parallel layout the mixer has no form for: only attention has one
        (dlscale.parallel.vit_parallel splits its heads and its tokens), and a model with noise inputs has none
        (the ranks of one sample would each draw their own noise). The key is the parallel section's."""
        if tensor_parallel * context_parallel == 1:
            return
        if self.noise_channels > 0:
            key = "parallel.tensor_parallel" if tensor_parallel > 1 else "parallel.context_parallel"
            raise InvalidValue(
                key,
                f"{max(tensor_parallel, context_parallel)} with model.noise_channels {self.noise_channels}: the "
                "ranks that share a sample would draw different noise; set parallel.tensor_parallel and "
                "parallel.context_parallel to 1 (data parallelism, DDP or FSDP2, trains a noise model)",
            )
        if self.mixer == "attention":
            return
        key, value = (
            ("parallel.tensor_parallel", tensor_parallel)
            if tensor_parallel > 1
            else ("parallel.context_parallel", context_parallel)
        )
        raise InvalidValue(
            key,
            f"{value} with model.mixer {self.mixer!r}: tensor and context parallelism split attention's heads "
            f"and tokens, and the {self.mixer} mixer has no such form; set parallel.tensor_parallel and "
            "parallel.context_parallel to 1 (data parallelism, DDP or FSDP2, works with every mixer)",
        )

    def check_training(self, train: object) -> None:
        """Noise inputs and the CRPS loss go together: the loss is what teaches the model to turn its noise into
        spread, and without noise the members of a CRPS ensemble would all be one forecast. ``train``: the
        ``train:`` section (its ``loss``)."""
        loss = getattr(train, "loss", "workload")
        if loss == "crps" and self.noise_channels == 0:
            raise InvalidValue(
                "train.loss",
                "crps trains the members of a model that reads noise, and model.noise_channels is 0 (the members "
                "would all be one forecast); set model.noise_channels, e.g. 4",
            )
        if loss != "crps" and self.noise_channels > 0:
            raise InvalidValue(
                "model.noise_channels",
                f"{self.noise_channels} with train.loss {loss!r}: a model's noise inputs are trained by the "
                "ensemble's CRPS (with the workload's loss the model learns to ignore them); set train.loss=crps "
                "with train.ensemble_members (e.g. 4), or model.noise_channels=0",
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden_dim(self) -> int:
        """Width of the MLP's hidden layer."""
        return int(self.mlp_ratio * self.embed_dim)
