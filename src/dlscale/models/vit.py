"""The ViT weather model: ERA5 fields in, the fields one step later out, at full resolution.

Architecture and parameter names follow the NERSC dl-at-scale tutorial's ViT, so its state dicts load
and its parameter counts hold (23,832,960 for `base`). The module is plain single-device torch:
tensor and context parallelism are applied from outside by swapping or wrapping the `nn.Linear`
layers (`q`, `k`, `v`, `proj`, `fc1`, `fc2`) and by splitting the token sequence between
`VisionTransformer.tokens` and the final `norm`.

``model.mixer: afno`` replaces every attention block by FourCastNet's AFNO block (:class:`AFNOBlock`, its filter
in :mod:`dlscale.models.afno`), ``model.mixer: sfno`` by the same block with the SFNO's spherical convolution
as its filter (:class:`dlscale.models.sfno.SFNOMixer`, on the latitudes of the patch centres); the patch
embedding, positional embedding, head and unpatchify stay. Such a model has no tensor- or context-parallel form
(the config refuses one).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dlscale.errors import InvalidValue
from dlscale.models.afno import AFNO2D, afno_flops_per_token_grid, check_kept_modes
from dlscale.models.drop_path import DropPath, drop_path_rates
from dlscale.models.sfno import SFNOMixer, sfno_mixer_flops
from dlscale.models.vit_config import ViTConfig

# The reference initialises every Linear weight and the positional embedding with this std.
INIT_STD = 0.02


def token_grid(img_size: tuple[int, int], patch_size: int) -> tuple[int, int]:
    """Return the (rows, columns) of patches for an image of `img_size` (H, W).

    Raises `InvalidValue` when the image is empty or a side is not a multiple of the patch size.
    """
    if len(img_size) != 2:
        raise InvalidValue("img_size", f"must be two sides (H, W), got {tuple(img_size)}")
    height, width = (int(side) for side in img_size)
    if height < 1 or width < 1:
        raise InvalidValue("img_size", f"sides must be at least 1, got {height}x{width}")
    if height % patch_size or width % patch_size:
        raise InvalidValue(
            "patch_size",
            f"{patch_size} does not divide img_size {height}x{width} "
            f"(remainders {height % patch_size} and {width % patch_size}); "
            "pick a patch size that divides both sides or crop the image",
        )
    return height // patch_size, width // patch_size


class PatchEmbed(nn.Module):
    """Cut the image into p x p patches and project each to a D-wide token, in row-major order."""

    def __init__(self, in_channels: int, embed_dim: int, patch_size: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, D, h, w) -> (B, h*w, D), token index = row * w + column.
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention with separate q, k, v and output projections.

    `q`, `k`, `v` and `proj` stay separate `nn.Linear` layers so tensor parallelism can shard them
    column- and row-wise; `attend` holds all the sequence mixing so context parallelism can gather k and
    v around it.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, attn_drop: float, proj_drop: float):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        # Holds the attention dropout rate; it is passed to SDPA rather than applied as a module.
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, heads * head_dim) -> (B, heads, N, head_dim); heads are inferred from the width."""
        batch, seq, width = x.shape
        return x.view(batch, seq, width // self.head_dim, self.head_dim).transpose(1, 2)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Non-causal scaled dot-product attention on (B, heads, N, head_dim) tensors.

        k and v may hold more tokens than q (a context-parallel rank attends its queries to all keys).
        """
        dropout_p = self.attn_drop.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (self.split_heads(layer(x)) for layer in (self.q, self.k, self.v))
        out = self.attend(q, k, v).transpose(1, 2).reshape(batch, seq, -1)
        return self.proj_drop(self.proj(out))


class Mlp(nn.Module):
    """Two-layer feed-forward network: fc1, exact GELU, dropout, fc2, dropout."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm transformer block: x + drop_path(attn(norm1(x))), then x + drop_path(mlp(norm2(x)))."""

    def __init__(self, cfg: ViTConfig, drop_path_rate: float):
        super().__init__()
        dim = cfg.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.attn = Attention(dim, cfg.num_heads, cfg.qkv_bias, attn_drop=cfg.dropout, proj_drop=cfg.dropout)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.mlp = Mlp(dim, cfg.mlp_hidden_dim, cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class AFNOBlock(nn.Module):
    """FourCastNet v1's block (NVlabs/FourCastNet ``networks/afnonet.py``, ``double_skip=True``) on (B, N, D)
    tokens of an h x w grid:

        y = filter(norm1(x)) + x           # the filter adds its own input too: y = norm1(x) + AFNO(...) + x
        out = y + drop_path(mlp(norm2(y)))

    The filter (:class:`dlscale.models.afno.AFNO2D`) sees the tokens as their (B, h, w, D) grid. Unlike the
    attention block, drop-path acts on the MLP branch only, as in the reference.
    """

    def __init__(
        self,
        cfg: ViTConfig,
        drop_path_rate: float,
        grid_size: tuple[int, int],
        filter_module: nn.Module | None = None,
    ):
        super().__init__()
        dim = cfg.embed_dim
        self.grid_size = grid_size
        self.norm1 = nn.LayerNorm(dim, eps=cfg.norm_eps)
        # AFNO's filter, or another on the same (B, h, w, D) grid that adds its own input (SFNO's)
        self.filter = filter_module or AFNO2D(
            dim, cfg.afno_num_blocks, cfg.afno_sparsity_threshold, cfg.afno_hard_thresholding_fraction
        )
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.mlp = Mlp(dim, cfg.mlp_hidden_dim, cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        grid = self.filter(self.norm1(x).reshape(batch, *self.grid_size, dim))
        x = grid.reshape(batch, tokens, dim) + x  # the double skip
        return x + self.drop_path(self.mlp(self.norm2(x)))


def build_block(
    cfg: ViTConfig,
    drop_path_rate: float,
    grid_size: tuple[int, int],
    token_latitudes: np.ndarray | None = None,
) -> nn.Module:
    """The block of ``cfg.mixer`` for tokens of a grid_size (h, w) grid: :class:`Block` (attention) or
    :class:`AFNOBlock` with AFNO's filter (afno) or SFNO's on the rows' ``token_latitudes`` (sfno)."""
    if cfg.mixer == "afno":
        check_kept_modes(grid_size, cfg.afno_hard_thresholding_fraction)
        return AFNOBlock(cfg, drop_path_rate, grid_size)
    if cfg.mixer == "sfno":
        mixer = SFNOMixer(
            token_latitudes, grid_size[1], cfg.embed_dim, cfg.sfno_num_blocks,
            key="model.mixer sfno: the latitudes of the patch rows (data.img_size / model.patch_size)",
            blocks_key="model.sfno_num_blocks",
        )  # fmt: skip
        return AFNOBlock(cfg, drop_path_rate, grid_size, mixer)
    return Block(cfg, drop_path_rate)


def patch_row_latitudes(latitudes: Sequence[float], patch_size: int) -> np.ndarray:
    """The latitude of each row of patch tokens: the mean of its ``patch_size`` image rows' latitudes (degrees)."""
    rows = np.asarray(latitudes, dtype=np.float64)
    if rows.size % patch_size:
        raise InvalidValue("patch_size", f"{patch_size} does not divide the {rows.size} image rows")
    return rows.reshape(-1, patch_size).mean(axis=1)


class VisionTransformer(nn.Module):
    """ViT mapping (B, in_channels, H, W) fields to (B, out_channels, H, W) fields.

    Forward is `unpatchify(head(norm(blocks(tokens(x)))))`; each stage is reachable on its own so a
    context-parallel wrapper can split the sequence after `tokens` and gather it before `head`.
    """

    def __init__(
        self,
        cfg: ViTConfig,
        img_size: tuple[int, int],
        in_channels: int,
        out_channels: int,
        latitudes: Sequence[float] | None = None,
    ):
        """``latitudes``: of the image's rows, in degrees (the SFNO mixer's grid; the other mixers ignore them)."""
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if value < 1:
                raise InvalidValue(name, f"must be at least 1, got {value}")
        self.grid_size = token_grid(img_size, cfg.patch_size)
        self.img_size = (int(img_size[0]), int(img_size[1]))
        self.patch_size = cfg.patch_size
        self.num_tokens = self.grid_size[0] * self.grid_size[1]
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.embed_dim = cfg.embed_dim
        self.mixer = cfg.mixer
        self.noise_channels = cfg.noise_channels
        # the weight that reads the noise channels after the state's (a weights-only start from the model without
        # noise inputs widens it: dlscale.checkpoint.noise_inputs)
        self.noise_input_weight = "patch_embed.proj.weight"
        token_latitudes = None
        if cfg.mixer == "sfno":
            if latitudes is None or len(latitudes) != self.img_size[0]:
                raise InvalidValue(
                    "model.mixer",
                    f"sfno needs the latitudes of the image's {self.img_size[0]} rows, got "
                    f"{'none' if latitudes is None else len(latitudes)}",
                )
            token_latitudes = patch_row_latitudes(latitudes, cfg.patch_size)

        self.patch_embed = PatchEmbed(in_channels + cfg.noise_channels, cfg.embed_dim, cfg.patch_size)
        self.pos_embed = nn.Parameter(torch.empty(1, self.num_tokens, cfg.embed_dim))
        self.pos_drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.Sequential(
            *(
                build_block(cfg, rate, self.grid_size, token_latitudes)
                for rate in drop_path_rates(cfg.dropout, cfg.depth)
            ),
        )
        self.norm = nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.embed_dim, out_channels * cfg.patch_size**2, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Reference init: trunc-normal(0.02) Linear weights and pos_embed, zero biases, unit LayerNorms.

        The patch-embedding convolution keeps PyTorch's default init, as in the reference; the AFNO filters
        keep their own (N(0, 0.02^2) weights and biases, :meth:`dlscale.models.afno.AFNO2D.reset_parameters`).
        """
        nn.init.trunc_normal_(self.pos_embed, std=INIT_STD)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=INIT_STD)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_channels, H, W) -> (B, N, D): patch embedding plus positional embedding, then dropout.

        A model with noise inputs (``noise_channels`` > 0) reads its noise as channels after the state's:
        given (``x`` of in_channels + noise_channels, as the CRPS training loss and the ensemble forecast give
        it, each member's noise drawn from its own seed), or, for a bare state, drawn here from torch's
        generator in training mode and zero in inference mode (a deterministic forecast: the members' median
        noise), so validation, ``evaluate`` and a plain forecast stay reproducible."""
        expected = (self.in_channels, *self.img_size)
        with_noise = self.in_channels + self.noise_channels
        if x.ndim != 4 or tuple(x.shape[2:]) != self.img_size or x.shape[1] not in (expected[0], with_noise):
            shape = f"(B, {expected[0]}, {expected[1]}, {expected[2]})"
            if self.noise_channels:
                shape += f" or, with its noise, (B, {with_noise}, {expected[1]}, {expected[2]})"
            raise ValueError(f"expected input of shape {shape}, got {tuple(x.shape)}")
        if x.shape[1] != with_noise:
            shape = (x.shape[0], self.noise_channels, *self.img_size)
            noise = (
                torch.randn(shape, device=x.device, dtype=x.dtype) if self.training else x.new_zeros(shape)
            )
            x = torch.cat([x, noise], dim=1)
        return self.pos_drop(self.patch_embed(x) + self.pos_embed)

    def unpatchify(self, x_tokens: torch.Tensor) -> torch.Tensor:
        """(B, N, out_channels * p * p) head output -> (B, out_channels, H, W) image.

        Feature index (r * p + c) * out_channels + ch of token (i, j) lands at pixel (i * p + r, j * p + c)
        of channel ch: patch row, patch column, channel, with channel fastest (the reference's order).
        """
        rows, cols = self.grid_size
        p, channels = self.patch_size, self.out_channels
        batch = x_tokens.shape[0]
        patches = x_tokens.reshape(batch, rows, cols, p, p, channels)
        # (B, i, j, r, c, ch) -> (B, ch, i, r, j, c): pixel row i * p + r, pixel column j * p + c.
        return patches.permute(0, 5, 1, 3, 2, 4).reshape(batch, channels, rows * p, cols * p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.tokens(x))
        return self.unpatchify(self.head(self.norm(x)))


def vit_flops_per_sample(
    cfg: ViTConfig, img_size: tuple[int, int], in_channels: int, out_channels: int
) -> int:
    """Analytic forward FLOPs of one sample: matmuls (2*m*n*k), attention and AFNO's FFTs, nothing else.

    Counts the patch embedding as a matmul, fc1/fc2, the head, and per block the mixer: for attention
    q/k/v/proj and QK^T plus AV (2 * 2 * N^2 * D); for afno the filter's two block-diagonal complex matmuls
    over the kept modes (four real matmuls each) and its forward and inverse FFT, each counted as
    5 * N log2(N) per channel (:func:`dlscale.models.afno.afno_flops_per_token_grid`), so MFU counts the FFTs.
    Norms, activations, softmax, shrinkage and additions are left out, as they are small and run off the
    matrix units. A training step is about three times this.
    """
    rows, cols = token_grid(img_size, cfg.patch_size)
    n, d, p = rows * cols, cfg.embed_dim, cfg.patch_size
    patch_embed = 2 * n * ((in_channels + cfg.noise_channels) * p * p) * d
    mlp = 2 * (2 * n * d * cfg.mlp_hidden_dim)
    head = 2 * n * d * (out_channels * p * p)
    if cfg.mixer == "afno":
        mixer = afno_flops_per_token_grid(
            d, cfg.afno_num_blocks, (rows, cols), cfg.afno_hard_thresholding_fraction
        )
    elif cfg.mixer == "sfno":
        mixer = sfno_mixer_flops(d, cfg.sfno_num_blocks, (rows, cols))
    else:
        projections = 4 * (2 * n * d * d)
        attention = 2 * (2 * n * n * d)
        mixer = projections + attention
    return patch_embed + cfg.depth * (mixer + mlp) + head
