"""ResNets for image classification (the LUMI summer school's ResNet-152 on CIFAR-100), in plain torch.

The architecture, parameter names and initialization are torchvision's, so its state dicts load and its
parameter counts hold: ResNet-18 / -50 / -152 with 1000 classes have 11,689,512 / 25,557,032 / 60,192,808
parameters, and ResNet-152 with the demo's 100 classes 58,348,708.

* stem: 7x7 stride-2 conv + BN + ReLU + 3x3 stride-2 max-pool (ImageNet's; the demo resizes its 32x32 images to
  224x224 for it), or with ``small_input_stem`` a 3x3 stride-1 conv + BN + ReLU and no pool, the usual stem for
  32x32 inputs (the image keeps its resolution into the first stage);
* four stages of blocks at widths w, 2w, 4w, 8w (w = ``width``, 64 in torchvision), the last three starting with
  stride 2: BasicBlock (two 3x3 convs) for depths 18 and 34, Bottleneck (1x1, 3x3, 1x1 with 4x expansion, the
  stride on the 3x3 conv: "ResNet v1.5") for 50, 101 and 152; a 1x1 conv + BN shortcut where the shape changes;
* global average pool and one linear layer.
"""

from __future__ import annotations

import torch
from torch import nn

from dlscale.models.resnet_config import EXPANSION, STAGES, ResNetConfig


def conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


def conv1x1(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, in_channels: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(in_channels, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + shortcut)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, with a residual connection (ResNet-50/101/152)."""

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv1x1(in_channels, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + shortcut)


BLOCKS: dict[str, type[BasicBlock] | type[Bottleneck]] = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet(nn.Module):
    """A ResNet of ``cfg`` for 3-channel images of any size (see the module docstring)."""

    def __init__(self, cfg: ResNetConfig, in_channels: int = 3):
        super().__init__()
        self.cfg = cfg
        block = BLOCKS[cfg.block_kind]
        width = cfg.width
        if cfg.small_input_stem:
            self.conv1 = conv3x3(in_channels, width)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        channels = width
        stages = []
        for index, blocks in enumerate(STAGES[cfg.depth][1]):
            planes = width * 2**index
            stage, channels = _stage(block, channels, planes, blocks, stride=1 if index == 0 else 2)
            stages.append(stage)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, cfg.num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torchvision's initialization: He-normal (fan-out) convs, BN scale 1 and shift 0; the linear layer
        keeps torch's default."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _stage(
    block: type[BasicBlock] | type[Bottleneck], in_channels: int, planes: int, blocks: int, stride: int
) -> tuple[nn.Sequential, int]:
    """One stage of ``blocks`` blocks; the first one changes stride and channels. Returns it and its output
    channels."""
    out_channels = planes * block.expansion
    downsample = None
    if stride != 1 or in_channels != out_channels:
        downsample = nn.Sequential(conv1x1(in_channels, out_channels, stride), nn.BatchNorm2d(out_channels))
    layers = [block(in_channels, planes, stride, downsample)]
    layers += [block(out_channels, planes) for _ in range(blocks - 1)]
    return nn.Sequential(*layers), out_channels


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def resnet_flops_per_sample(cfg: ResNetConfig, image_size: tuple[int, int], in_channels: int = 3) -> int:
    """Forward FLOPs of one image: 2 per multiply-accumulate of every conv and of the linear layer.

    This is what ``torch.utils.flop_counter`` counts (BN, ReLU, pooling and the residual additions are not
    counted); tools that count multiply-accumulates (fvcore, the demo's get_parameters.py) report half.
    """
    macs = 0

    def conv(size: tuple[int, int], c_in: int, c_out: int, kernel: int, stride: int) -> tuple[int, int]:
        """Adds one conv (padding kernel // 2, as all of a ResNet's) and returns its output size."""
        nonlocal macs
        out = tuple(_conv_out(side, kernel, stride, kernel // 2) for side in size)
        macs += c_in * c_out * kernel * kernel * out[0] * out[1]
        return out

    if cfg.small_input_stem:
        size = conv(image_size, in_channels, cfg.width, 3, 1)
    else:
        size = conv(image_size, in_channels, cfg.width, 7, 2)
        size = tuple(_conv_out(side, 3, 2, 1) for side in size)  # max-pool: not counted
    kind, stage_blocks = STAGES[cfg.depth]
    channels = cfg.width
    for index, blocks in enumerate(stage_blocks):
        planes = cfg.width * 2**index
        out_channels = planes * EXPANSION[kind]
        for number in range(blocks):
            stride = 2 if index > 0 and number == 0 else 1
            if stride != 1 or channels != out_channels:  # the shortcut's 1x1 conv, on the block's input
                conv(size, channels, out_channels, 1, stride)
            if kind == "basic":
                inner = conv(size, channels, planes, 3, stride)
                size = conv(inner, planes, planes, 3, 1)
            else:
                inner = conv(size, channels, planes, 1, 1)
                inner = conv(inner, planes, planes, 3, stride)
                size = conv(inner, planes, out_channels, 1, 1)
            channels = out_channels
    macs += channels * cfg.num_classes
    return 2 * macs
