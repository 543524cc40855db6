"""The torch optimizer an ``optim:`` section names (Adam, AdamW, Adadelta or SGD), fused or capturable where asked;
the section itself, the learning rate and its batch-size scaling are ``optim_config.py``'s."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dlscale.training.optim_config import OptimConfig


def build_optimizer(
    cfg: OptimConfig, parameters: Iterable[torch.nn.Parameter], lr: float, capturable: bool = False
) -> torch.optim.Optimizer:
    """The optimizer of ``cfg`` at learning rate ``lr`` (the already batch-scaled peak LR).

    ``capturable`` (Adam and AdamW on a GPU) keeps the step count on the device and accepts a tensor LR,
    so that the update can be recorded in a CUDA graph.
    """
    params = list(parameters)
    fused = {"fused": True} if cfg.enable_fused else {}
    if capturable:
        if cfg.optimizer in ("SGD", "Adadelta"):
            raise ValueError(
                f"{cfg.optimizer} has no capturable implementation here; its update runs outside the CUDA graph"
            )
        fused["capturable"] = True
    if cfg.optimizer == "Adam":
        return torch.optim.Adam(
            params, lr=lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, **fused
        )
    if cfg.optimizer == "AdamW":
        return torch.optim.AdamW(
            params, lr=lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, **fused
        )
    if cfg.optimizer == "Adadelta":
        return torch.optim.Adadelta(params, lr=lr, rho=cfg.rho, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, **fused)
