"""The small MNIST convolutional network of the USC CARC deep-learning workshop (PyTorch's MNIST example).

Two 3x3 convolutions (1 -> 32 -> 64 channels, each followed by ReLU), a 2x2 max-pool, dropout, then two
fully connected layers (9216 -> 128 -> 10) with ReLU and dropout between them, and log-probabilities out
(train it with ``F.nll_loss``). 1,199,882 parameters. The 9216 features are 64 channels of 12 x 12, so the
network takes 1 x 28 x 28 images only. Parameter names (conv1, conv2, fc1, fc2) follow the workshop's script,
so its saved ``mnist_cnn.pt`` state dict loads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlscale.models.cnn_config import CNNConfig

IMAGE_SIZE = 28  # MNIST's side; the flattened feature count below depends on it
NUM_CLASSES = 10


class MnistCNN(nn.Module):
    """conv1, ReLU, conv2, max-pool, ReLU, dropout, fc1, ReLU, dropout, fc2, log_softmax (the workshop has
    ReLU before the pool: the same function, see ``forward``)."""

    def __init__(self, cfg: CNNConfig | None = None):
        super().__init__()
        cfg = cfg or CNNConfig()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3, stride=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, stride=1)
        self.dropout1 = nn.Dropout(cfg.dropout1)
        self.dropout2 = nn.Dropout(cfg.dropout2)
        pooled_side = (IMAGE_SIZE - 2 - 2) // 2  # two unpadded 3x3 convolutions, then a 2x2 pool: 12
        self.fc1 = nn.Linear(64 * pooled_side * pooled_side, 128)
        self.fc2 = nn.Linear(128, NUM_CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (B, 10) of images (B, 1, 28, 28)."""
        x = F.relu(self.conv1(images))
        # The workshop writes max_pool2d(relu(conv2(x))); relu(max_pool2d(...)) is the same function with the
        # same gradients (relu is monotonic, so it commutes with a max), on a quarter of the values. The order
        # matters for torch.compile: torch 2.13's inductor on CPU gives zero gradients for conv -> relu ->
        # max_pool2d at a batch of 24 or more, so the compiled workshop order never trains its convolutions.
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = self.dropout1(x)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        x = self.fc2(self.dropout2(x))
        return F.log_softmax(x, dim=1)
