"""The model zoo: named networks from the five papers and torchvision, built with random weights.

``ZOO`` maps a name to a :class:`ZooEntry`; :func:`build` makes the module (on the CPU, random
initialisation, never a weight download) and the per-sample input shape. Every entry takes
``num_classes`` and ``input_size`` (the side of a square input); an impossible size is a
``ModelError``. Outputs are plain logits: ``CrossEntropyLoss`` applies the softmax, so no entry has
a Softmax layer. Every module traces with ``torch.fx``, and the FC phase of each net follows the
boundary that ``find_boundary`` finds (``nin`` has no FC phase).

Layer sizes of the nets the papers describe only in words (the two Yan et al. / Project Adam
nets) are our choice; their docstrings say what is from the paper and what is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch.nn as nn
import torch.nn.functional as F

from layerplan.errors import ModelError


@dataclass(frozen=True, kw_only=True, slots=True)
class ZooEntry:
    """One named network of the zoo."""

    name: str
    """The name a person types (``layerplan plan --model NAME``)."""
    factory: Callable[[int, int], nn.Module]
    """``factory(num_classes, input_size)`` → a freshly initialised module."""
    default_input_size: int
    """Side of the square input the net was designed for (pixels)."""
    default_num_classes: int
    """Width of the output layer the net was designed for."""
    in_channels: int
    """Channels of the input image."""
    source: str
    """Paper or code the architecture follows."""

    def input_shape(self, input_size: int | None = None) -> tuple[int, int, int]:
        """Per-sample input shape (channels, size, size)."""
        s = self.default_input_size if input_size is None else input_size
        return (self.in_channels, s, s)


# ---- size arithmetic --------------------------------------------------------------------------
def _conv(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _pool(size: int, kernel: int, stride: int, padding: int = 0, ceil: bool = False) -> int:
    span = size + 2 * padding - kernel
    out = (math.ceil(span / stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + padding:  # PyTorch/Caffe: the last window must start inside
        out -= 1
    return out


def _min_size(spatial: Callable[[int], int]) -> int:
    s = 1
    while s < 4096 and spatial(s) < 1:
        s += 1
    return s


def _spatial(name: str, size: int, spatial: Callable[[int], int]) -> int:
    """Side of the last feature map for input ``size``, or a ModelError naming the smallest size."""
    try:
        final = spatial(size)
    except (ValueError, ZeroDivisionError):
        final = 0
    if final < 1:
        raise ModelError(f"{name} needs --input-size of at least {_min_size(_safe(spatial))} (got {size}): "
                         "its feature maps vanish")
    return final


def _safe(spatial: Callable[[int], int]) -> Callable[[int], int]:
    def f(s: int) -> int:
        try:
            return spatial(s)
        except (ValueError, ZeroDivisionError):
            return 0

    return f


def _stages(s: int, *steps: Callable[[int], int]) -> int:
    for step in steps:
        s = step(s)
        if s < 1:
            return 0
    return s


def _check_classes(name: str, num_classes: int) -> None:
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise ModelError(f"{name}: --num-classes must be a positive integer, got {num_classes!r}")


# ---- small nets -------------------------------------------------------------------------------
class Debug(nn.Module):
    """Two convs and two linear layers on 3×8×8: analyses in milliseconds, has a phase boundary."""

    def __init__(self, num_classes: int = 10, input_size: int = 8) -> None:
        super().__init__()
        s = _spatial("debug", input_size, lambda s: _stages(s, lambda v: _pool(v, 2, 2)))
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(8 * s * s, 16)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.pool(self.relu1(self.conv1(x)))
        x = self.flatten(self.relu2(self.conv2(x)))
        return self.fc2(self.relu3(self.fc1(x)))


class LeNet5(nn.Module):
    """LeNet-5 (LeCun, Bottou, Bengio, Haffner 1998, Fig. 2): 1×32×32, C1 6@5×5, S2, C3 16@5×5,
    S4, C5 120@5×5, F6 84, output 10; tanh. Simplifications: S layers are plain average pooling
    (the paper's have a trainable coefficient and bias), C3 connects to all six S2 maps (the
    paper's Table 1 uses a sparse connection scheme) and the RBF output is a linear layer."""

    def __init__(self, num_classes: int = 10, input_size: int = 32) -> None:
        super().__init__()
        s = _spatial("lenet5", input_size, lambda s: _stages(
            s, lambda v: _conv(v, 5), lambda v: _pool(v, 2, 2), lambda v: _conv(v, 5), lambda v: _pool(v, 2, 2),
            lambda v: _conv(v, 5)))
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5), nn.Tanh(), nn.AvgPool2d(2),
            nn.Conv2d(6, 16, 5), nn.Tanh(), nn.AvgPool2d(2),
            nn.Conv2d(16, 120, 5), nn.Tanh(),
        )
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(nn.Linear(120 * s * s, 84), nn.Tanh(), nn.Linear(84, num_classes))

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


class CaffeNet(nn.Module):
    """BVLC reference CaffeNet (Jia et al. 2014, models/bvlc_reference_caffenet): AlexNet with
    each pooling layer *before* its local response normalisation; 3×227×227; Caffe's ceil-mode
    pooling. ``groups=2`` reproduces Caffe's two-tower conv2/conv4/conv5 (60,965,224 parameters);
    the zoo default ``groups=1`` uses full convolutions (one device holds every filter), as
    torchvision's AlexNet does."""

    def __init__(self, num_classes: int = 1000, input_size: int = 227, groups: int = 1) -> None:
        super().__init__()
        if groups not in (1, 2):
            raise ModelError(f"caffenet: groups must be 1 or 2, got {groups!r}")
        s = _spatial("caffenet", input_size, lambda s: _stages(
            s, lambda v: _conv(v, 11, 4), lambda v: _pool(v, 3, 2, ceil=True), lambda v: _conv(v, 5, 1, 2),
            lambda v: _pool(v, 3, 2, ceil=True), lambda v: _conv(v, 3, 1, 1), lambda v: _pool(v, 3, 2, ceil=True)))
        lrn = dict(size=5, alpha=1e-4, beta=0.75, k=1.0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, 11, stride=4), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.LocalResponseNorm(**lrn),
            nn.Conv2d(96, 256, 5, padding=2, groups=groups), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, ceil_mode=True), nn.LocalResponseNorm(**lrn),
            nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 384, 3, padding=1, groups=groups), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1, groups=groups), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, ceil_mode=True),
        )
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(256 * s * s, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


class OverFeatFast(nn.Module):
    """OverFeat "fast" model (Sermanet et al., ICLR 2014, Table 1): 3×231×231; conv 96@11×11/4,
    pool 2; conv 256@5×5, pool 2; conv 512, 1024, 1024 @3×3 (pad 1), pool 2; FC 3072, 4096, 1000
    with dropout on FC 6 and 7 (§3.1)."""

    def __init__(self, num_classes: int = 1000, input_size: int = 231) -> None:
        super().__init__()
        s = _spatial("overfeat", input_size, lambda s: _stages(
            s, lambda v: _conv(v, 11, 4), lambda v: _pool(v, 2, 2), lambda v: _conv(v, 5),
            lambda v: _pool(v, 2, 2), lambda v: _pool(v, 2, 2)))
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, 11, stride=4), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
            nn.Conv2d(96, 256, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
            nn.Conv2d(256, 512, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(512, 1024, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(1024, 1024, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
        )
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(1024 * s * s, 3072), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(3072, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


class NiN(nn.Module):
    """Network in Network for CIFAR-10 (Lin, Chen, Yan, ICLR 2014; the authors' Caffe model
    ``cifar10_nin``): three mlpconv blocks (5×5 192 → 1×1 160 → 1×1 96; 5×5 192 → 1×1 192 → 1×1
    192; 3×3 192 → 1×1 192 → 1×1 classes), 3×3/2 max and average pooling (Caffe ceil mode),
    dropout 0.5, then global average pooling: no fully connected layer."""

    def __init__(self, num_classes: int = 10, input_size: int = 32) -> None:
        super().__init__()
        _spatial("nin", input_size, lambda s: _stages(
            s, lambda v: _pool(v, 3, 2, ceil=True), lambda v: _pool(v, 3, 2, ceil=True)))

        def mlpconv(cin: int, k: int, widths: tuple[int, int, int]) -> list[nn.Module]:
            a, b, c = widths
            return [nn.Conv2d(cin, a, k, padding=k // 2), nn.ReLU(inplace=True), nn.Conv2d(a, b, 1),
                    nn.ReLU(inplace=True), nn.Conv2d(b, c, 1), nn.ReLU(inplace=True)]

        self.features = nn.Sequential(
            *mlpconv(3, 5, (192, 160, 96)), nn.MaxPool2d(3, 2, ceil_mode=True), nn.Dropout(0.5),
            *mlpconv(96, 5, (192, 192, 192)), nn.AvgPool2d(3, 2, ceil_mode=True), nn.Dropout(0.5),
            *mlpconv(192, 3, (192, 192, num_classes)),
            nn.AdaptiveAvgPool2d(1),
        )
        self.flatten = nn.Flatten()

    def forward(self, x):
        return self.flatten(self.features(x))


_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG16Cifar(nn.Module):
    """VGG-16 (Simonyan & Zisserman, ICLR 2015, configuration D, no batch norm) on 3×32×32: the
    thirteen 3×3 convolutions and five poolings leave 512×1×1; FC 512-4096-4096-classes with
    dropout. 33,638,218 parameters for 10 classes."""

    def __init__(self, num_classes: int = 10, input_size: int = 32) -> None:
        super().__init__()
        s = _spatial("vgg16_cifar", input_size, lambda s: _stages(s, *[lambda v: _pool(v, 2, 2)] * 5))
        layers: list[nn.Module] = []
        cin = 3
        for v in _VGG16:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                cin = int(v)
        self.features = nn.Sequential(*layers)
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(512 * s * s, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


class AlexNetCifar(nn.Module):
    """torchvision's AlexNet (Krizhevsky 2014, "One weird trick" widths) for 3×32×32: the first
    conv is 64@3×3 stride 1 (stock 11×11/4 makes the maps vanish) and there is no adaptive
    average pooling, so conv5's 256×3×3 feeds FC 4096-4096-classes. 1.21 GFLOP per image forward +
    backward (EMULATION.md, "CPU speed"); 28,711,754 parameters for 10 classes."""

    def __init__(self, num_classes: int = 10, input_size: int = 32) -> None:
        super().__init__()
        s = _spatial("alexnet_cifar", input_size, lambda s: _stages(
            s, lambda v: _pool(v, 3, 2), lambda v: _pool(v, 3, 2), lambda v: _pool(v, 3, 2)))
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, stride=1, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        )
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(256 * s * s, 4096), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


class _BasicBlock(nn.Module):
    """He et al. 2016 §4.2 basic block with option-A shortcuts (identity; stride-2 subsampling
    and zero-padded channels when the shape changes: no parameters)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride = stride
        self.pad = (cout - cin) // 2

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.stride != 1 or self.pad:
            shortcut = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, self.pad, self.pad))
        return self.relu(out + shortcut)


class ResNetCifar(nn.Module):
    """ResNet-20 for CIFAR-10 (He, Zhang, Ren, Sun, CVPR 2016, §4.2): 3×3 conv 16, then 3 stages
    of 3 basic blocks with 16, 32, 64 filters (stride 2 between stages), global average pooling,
    FC 64→classes; option-A shortcuts. 269,722 parameters (the paper's 0.27M)."""

    def __init__(self, num_classes: int = 10, input_size: int = 32, blocks: int = 3) -> None:
        super().__init__()
        _spatial("resnet_cifar", input_size, lambda s: _stages(s, lambda v: _conv(v, 3, 2, 1), lambda v: _conv(v, 3, 2, 1)))
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(*[_BasicBlock(16, 16, 1) for _ in range(blocks)])
        self.layer2 = nn.Sequential(_BasicBlock(16, 32, 2), *[_BasicBlock(32, 32, 1) for _ in range(blocks - 1)])
        self.layer3 = nn.Sequential(_BasicBlock(32, 64, 2), *[_BasicBlock(64, 64, 1) for _ in range(blocks - 1)])
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.flatten(self.avgpool(x)))


class YanMnist(nn.Module):
    """The MNIST net of Yan et al. (KDD 2015, §6) / Project Adam (Chilimbi et al., OSDI 2014):
    2 conv, 2 linear layers and a 10-way softmax over the second, ~2.5M connections. The papers
    give no layer sizes; ours are Caffe's LeNet convolutions (20 and 50 filters of 5×5, each
    followed by 2×2 max pooling) on 1×28×28 with a 750-unit hidden layer, which makes the
    connections (multiply-adds per image) 288,000 + 1,600,000 + 600,000 + 7,500 = 2,495,500."""

    def __init__(self, num_classes: int = 10, input_size: int = 28) -> None:
        super().__init__()
        s = _spatial("yan_mnist", input_size, lambda s: _stages(
            s, lambda v: _conv(v, 5), lambda v: _pool(v, 2, 2), lambda v: _conv(v, 5), lambda v: _pool(v, 2, 2)))
        self.features = nn.Sequential(
            nn.Conv2d(1, 20, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
            nn.Conv2d(20, 50, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
        )
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(nn.Linear(50 * s * s, 750), nn.ReLU(inplace=True), nn.Linear(750, num_classes))

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


class YanImageNet22k(nn.Module):
    """The ImageNet-22K net of Yan et al. (KDD 2015, §6) / Project Adam (Chilimbi et al., OSDI
    2014): 5 conv, 2 linear layers and a 22,000-way softmax over the second, > 2 billion
    connections. The papers give no layer sizes; ours widen AlexNet's five convolutions (128@11×11/4,
    384@5×5, 512, 512, 384 @3×3, 3×3/2 max pooling after conv 1, 2 and 5) on 3×224×224, then FC
    4096 and the 22,000-way output: 2.18 billion connections (multiply-adds per image),
    154M parameters, 95% of them in the two linear layers."""

    def __init__(self, num_classes: int = 22000, input_size: int = 224) -> None:
        super().__init__()
        s = _spatial("yan_imagenet22k", input_size, lambda s: _stages(
            s, lambda v: _conv(v, 11, 4, 2), lambda v: _pool(v, 3, 2), lambda v: _pool(v, 3, 2),
            lambda v: _pool(v, 3, 2)))
        self.features = nn.Sequential(
            nn.Conv2d(3, 128, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(128, 384, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(384, 512, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(512, 512, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(512, 384, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        )
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(nn.Linear(384 * s * s, 4096), nn.ReLU(inplace=True),
                                        nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(self.flatten(self.features(x)))


# ---- torchvision ------------------------------------------------------------------------------
def _torchvision(fn_name: str, min_size: int, **kwargs) -> Callable[[int, int], nn.Module]:
    def factory(num_classes: int, input_size: int) -> nn.Module:
        if input_size < min_size:
            raise ModelError(f"{fn_name} needs --input-size of at least {min_size} (got {input_size}): "
                             "its feature maps vanish")
        import torchvision.models as tvm

        return getattr(tvm, fn_name)(weights=None, num_classes=num_classes, **kwargs)

    factory.__name__ = fn_name
    return factory


def _cls(cls: type[nn.Module], name: str) -> Callable[[int, int], nn.Module]:
    def factory(num_classes: int, input_size: int) -> nn.Module:
        return cls(num_classes=num_classes, input_size=input_size)

    factory.__name__ = name
    return factory


def _entries() -> dict[str, ZooEntry]:
    tv = "torchvision.models"
    rows = [
        ("debug", _cls(Debug, "debug"), 8, 10, 3, "layerplan: 2 conv + 2 linear on 3×8×8, for fast tests"),
        ("lenet5", _cls(LeNet5, "lenet5"), 32, 10, 1, "LeCun et al. 1998, Gradient-based learning applied to "
         "document recognition, Fig. 2"),
        ("yan_mnist", _cls(YanMnist, "yan_mnist"), 28, 10, 1, "Yan et al. KDD'15 §6 / Chilimbi et al. OSDI'14 "
         "(Project Adam) MNIST net; layer sizes ours (Caffe LeNet convs), 2.5M connections"),
        ("nin", _cls(NiN, "nin"), 32, 10, 3, "Lin, Chen, Yan ICLR'14, Network in Network, CIFAR-10 Caffe model "
         "(no FC layers)"),
        ("resnet_cifar", _cls(ResNetCifar, "resnet_cifar"), 32, 10, 3, "He et al. CVPR'16 §4.2, ResNet-20 for "
         "CIFAR-10 (option A shortcuts), 0.27M params"),
        ("alexnet_cifar", _cls(AlexNetCifar, "alexnet_cifar"), 32, 10, 3, "torchvision AlexNet with a 3×3/1 first "
         "conv for 32×32 input, FC 4096; 1.21 GFLOP/img fwd+bwd (EMULATION.md)"),
        ("vgg16_cifar", _cls(VGG16Cifar, "vgg16_cifar"), 32, 10, 3, "Simonyan & Zisserman ICLR'15 VGG-16 (D, no BN) "
         "on 32×32, FC 512-4096-4096-10"),
        ("alexnet", _torchvision("alexnet", 63), 224, 1000, 3, f"{tv}.alexnet: Krizhevsky 2014, One weird trick"),
        ("caffenet", _cls(CaffeNet, "caffenet"), 227, 1000, 3, "Jia et al. 2014, Caffe bvlc_reference_caffenet "
         "(pool before LRN; groups=1)"),
        ("overfeat", _cls(OverFeatFast, "overfeat"), 231, 1000, 3, "Sermanet et al. ICLR'14, OverFeat fast model, "
         "Table 1"),
        ("vgg11", _torchvision("vgg11", 32), 224, 1000, 3, f"{tv}.vgg11: Simonyan & Zisserman ICLR'15, config A"),
        ("vgg16", _torchvision("vgg16", 32), 224, 1000, 3, f"{tv}.vgg16: Simonyan & Zisserman ICLR'15, config D"),
        ("vgg19", _torchvision("vgg19", 32), 224, 1000, 3, f"{tv}.vgg19: Simonyan & Zisserman ICLR'15, config E"),
        ("googlenet", _torchvision("googlenet", 15, aux_logits=False, init_weights=False), 224, 1000, 3,
         f"{tv}.googlenet: Szegedy et al. CVPR'15 (no auxiliary classifiers)"),
        ("inception_v3", _torchvision("inception_v3", 75, aux_logits=False, init_weights=False), 299, 1000, 3,
         f"{tv}.inception_v3: Szegedy et al. CVPR'16 (no auxiliary classifier)"),
        ("inception_v3_aux", _torchvision("inception_v3", 75, aux_logits=True, init_weights=False), 299, 1000, 3,
         f"{tv}.inception_v3 with its auxiliary classifier (27,161,264 params; returns logits and aux logits)"),
        ("resnet50", _torchvision("resnet50", 1), 224, 1000, 3, f"{tv}.resnet50: He et al. CVPR'16"),
        ("resnet152", _torchvision("resnet152", 1), 224, 1000, 3, f"{tv}.resnet152: He et al. CVPR'16"),
        ("yan_imagenet22k", _cls(YanImageNet22k, "yan_imagenet22k"), 224, 22000, 3, "Yan et al. KDD'15 §6 / "
         "Chilimbi et al. OSDI'14 (Project Adam) ImageNet-22K net; layer sizes ours, 2.18B connections"),
    ]
    return {name: ZooEntry(name=name, factory=factory, default_input_size=size, default_num_classes=classes,
                           in_channels=channels, source=source)
            for name, factory, size, classes, channels, source in rows}


ZOO: dict[str, ZooEntry] = _entries()
"""Every zoo network by name."""


def entry(name: str) -> ZooEntry:
    """The zoo entry called ``name`` (ModelError naming close matches otherwise)."""
    try:
        return ZOO[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, list(ZOO), n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ModelError(f"unknown zoo model {name!r}{hint}; `layerplan zoo` lists them") from None


def build(name: str, *, num_classes: int | None = None, input_size: int | None = None) -> tuple[nn.Module, tuple[int, ...]]:
    """(module with random weights, per-sample input shape) for zoo network ``name``."""
    e = entry(name)
    nc = e.default_num_classes if num_classes is None else num_classes
    size = e.default_input_size if input_size is None else input_size
    _check_classes(name, nc)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ModelError(f"{name}: --input-size must be a positive integer, got {size!r}")
    return e.factory(nc, size), e.input_shape(size)


__all__ = ["ZOO", "ZooEntry", "build", "entry"]
