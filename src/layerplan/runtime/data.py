"""Training data for the runtime, sharded deterministically over the data workers.

Sources: ``synthetic`` (seeded random inputs and labels, a pure function of (seed, sample index)),
``digits`` (scikit-learn's 1,797 8×8 digits, resized to the net's input and replicated to its
channels, normalised; labels 0–9), ``digits-augmented`` (the same digits, each sample of the stream
randomly rotated, scaled and shifted: a training loss that falls over thousands of iterations, not
hundreds, as a real data set's does) and ``imagefolder:PATH`` (torchvision ImageFolder, resized).

Sharding: the samples form one stream — epoch after epoch of a permutation seeded by (seed, epoch)
(synthetic: the identity over an endless index). At global step s, data worker w of n reads the
stream positions [(s·n + w)·K, (s·n + w + 1)·K): the union over the workers of step s is exactly
the single-process global batch of step s, in worker order. The position in the data is therefore
a function of the step alone; checkpoints record it (``Sharder.position``) for people and checks,
and resuming at step s continues the stream exactly.

Labels are read locally by whichever rank computes the loss (Stanza's FC worker, RALP's PS
worker): they are a few bytes and are not counted as network traffic.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from layerplan.errors import ConfigError

_MIX = 0x9E3779B97F4A7C15


def _seed(*parts: int) -> int:
    h = 0x243F6A8885A308D3
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * _MIX + 0x632BE59BD9B4E5D) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


class SyntheticSource:
    """Random inputs (standard normal) and labels; sample i depends only on (seed, i)."""

    size = None

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, seed: int):
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.seed = seed

    def inputs(self, idx: list[int]):
        import torch

        out = torch.empty((len(idx), *self.input_shape))
        g = torch.Generator()
        for k, i in enumerate(idx):
            g.manual_seed(_seed(self.seed, i, 1))
            out[k] = torch.randn(self.input_shape, generator=g)
        return out

    def labels(self, idx: list[int]):
        import torch

        g = torch.Generator()
        out = torch.empty(len(idx), dtype=torch.long)
        for k, i in enumerate(idx):
            g.manual_seed(_seed(self.seed, i, 2))
            out[k] = torch.randint(self.num_classes, (1,), generator=g)[0]
        return out


class DigitsSource:
    """sklearn's digits: 1,797 8×8 images (0–16), resized (bilinear) to H×W, replicated to C
    channels, normalised to zero mean and unit variance over the whole set; labels 0–9."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        import torch

        if len(input_shape) != 3:
            raise ConfigError(f"digits needs an image network (C, H, W input), this one takes {input_shape}")
        if num_classes < 10:
            raise ConfigError(f"digits has 10 classes; the network has {num_classes} outputs")
        images, target = _digits()
        x = torch.tensor(images, dtype=torch.float32) / 16.0
        self._images = (x - x.mean()) / x.std()
        self._labels = torch.tensor(target, dtype=torch.long)
        self.input_shape = tuple(input_shape)
        self.size = len(self._labels)

    def inputs(self, idx: list[int]):
        import torch
        import torch.nn.functional as F

        c, h, w = self.input_shape
        x = self._images[torch.tensor(idx, dtype=torch.long)][:, None]
        if (h, w) != (8, 8):
            x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
        return x.expand(-1, c, -1, -1).contiguous()

    def labels(self, idx: list[int]):
        import torch

        return self._labels[torch.tensor(idx, dtype=torch.long)]


class AugmentedDigitsSource(DigitsSource):
    """The digits, each sample of the stream transformed by its own random affine map of the 8×8
    image (bilinear, zero outside): rotation U(−ROTATE_DEG, ROTATE_DEG), scale U(1 − SCALE,
    1 + SCALE), shift U(−SHIFT_PX, SHIFT_PX) pixels in each direction — drawn from (seed, stream
    position), so the same step of any strategy sees the same images and every epoch new ones."""

    ROTATE_DEG = 20.0
    SCALE = 0.15
    SHIFT_PX = 1.0
    by_position = True
    """``Sharder`` passes the stream positions (the transform's seed) with the indices."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, seed: int):
        super().__init__(input_shape, num_classes)
        self.seed = seed
        self._background = float(self._images.min())  # a blank pixel, normalised

    def params(self, positions: list[int]):
        """(angle_rad, scale, shift_x_px, shift_y_px) per position: four uniforms from two hashes."""
        out = []
        for p in positions:
            a, b = _seed(self.seed, p, 4), _seed(self.seed, p, 5)
            u = [(a & 0xFFFFFFF) / 2**28, ((a >> 28) & 0xFFFFFFF) / 2**28,
                 (b & 0xFFFFFFF) / 2**28, ((b >> 28) & 0xFFFFFFF) / 2**28]
            out.append((math.radians(self.ROTATE_DEG) * (2 * u[0] - 1), 1 + self.SCALE * (2 * u[1] - 1),
                        self.SHIFT_PX * (2 * u[2] - 1), self.SHIFT_PX * (2 * u[3] - 1)))
        return out

    def inputs(self, idx: list[int], positions: list[int] | None = None):
        import torch
        import torch.nn.functional as F

        if positions is None:
            raise ValueError("digits-augmented draws each sample's transform from its stream position")
        x = self._images[torch.tensor(idx, dtype=torch.long)][:, None] - self._background
        theta = torch.tensor([[[math.cos(a) / s, -math.sin(a) / s, -dx * 2 / 8],
                               [math.sin(a) / s, math.cos(a) / s, -dy * 2 / 8]]
                              for a, s, dx, dy in self.params(positions)], dtype=x.dtype)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + self._background
        c, h, w = self.input_shape
        if (h, w) != (8, 8):
            x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
        return x.expand(-1, c, -1, -1).contiguous()


class ImageFolderSource:
    """torchvision ImageFolder at PATH, Resize((H, W)) + ToTensor (grayscale when C = 1)."""

    def __init__(self, path: str, input_shape: tuple[int, ...], num_classes: int):
        from pathlib import Path

        from torchvision import datasets, transforms

        if len(input_shape) != 3 or input_shape[0] not in (1, 3):
            raise ConfigError(f"imagefolder needs a 1- or 3-channel image network, this one takes {input_shape}")
        if not Path(path).is_dir():
            raise ConfigError(f"imagefolder: {path!r} is not a directory")
        c, h, w = input_shape
        tf = [transforms.Resize((h, w))]
        if c == 1:
            tf.append(transforms.Grayscale(1))
        tf.append(transforms.ToTensor())
        try:
            self._ds = datasets.ImageFolder(path, transform=transforms.Compose(tf))
        except (FileNotFoundError, RuntimeError) as e:
            raise ConfigError(f"imagefolder: {e}") from None
        if len(self._ds.classes) > num_classes:
            raise ConfigError(f"imagefolder: {len(self._ds.classes)} classes in {path!r}, the network has "
                              f"{num_classes} outputs")
        self.size = len(self._ds)

    def inputs(self, idx: list[int]):
        import torch

        return torch.stack([self._ds[i][0] for i in idx])

    def labels(self, idx: list[int]):
        import torch

        return torch.tensor([self._ds.targets[i] for i in idx], dtype=torch.long)


@lru_cache(maxsize=1)
def _digits():
    """sklearn's digits as NumPy arrays (images, labels), read once per process."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


def preload(data: str) -> None:
    """Read what a data source needs once, here: ranks forked from this process inherit it
    (``launch.Session`` calls it; importing scikit-learn in six ranks at once costs seconds)."""
    if data in ("digits", "digits-augmented"):
        _digits()


def make_source(data: str, input_shape: tuple[int, ...], num_classes: int, seed: int):
    if data == "synthetic":
        return SyntheticSource(input_shape, num_classes, seed)
    if data == "digits":
        return DigitsSource(input_shape, num_classes)
    if data == "digits-augmented":
        return AugmentedDigitsSource(input_shape, num_classes, seed)
    if data.startswith("imagefolder:"):
        return ImageFolderSource(data.split(":", 1)[1], input_shape, num_classes)
    raise ConfigError(f"unknown data {data!r}: expected synthetic, digits, digits-augmented or imagefolder:PATH")


class Sharder:
    """Step s, data worker w → its K samples (see the module docstring)."""

    def __init__(self, source, workers: int, batch_size: int, seed: int, dtype=None):
        self.source = source
        self.dtype = dtype
        self.n = workers
        self.k = batch_size
        self.seed = seed

    @lru_cache(maxsize=4)
    def _perm(self, epoch: int):
        import torch

        g = torch.Generator().manual_seed(_seed(self.seed, epoch, 3))
        return torch.randperm(self.source.size, generator=g).tolist()

    def _indices(self, start: int, count: int) -> list[int]:
        if self.source.size is None:
            return list(range(start, start + count))
        size = self.source.size
        return [self._perm(p // size)[p % size] for p in range(start, start + count)]

    def first_position(self, step: int, worker: int) -> int:
        return (step * self.n + worker) * self.k

    def indices(self, step: int, worker: int) -> list[int]:
        return self._indices(self.first_position(step, worker), self.k)

    def inputs(self, step: int, worker: int):
        if getattr(self.source, "by_position", False):
            start = self.first_position(step, worker)
            x = self.source.inputs(self._indices(start, self.k), list(range(start, start + self.k)))
        else:
            x = self.source.inputs(self.indices(step, worker))
        return x if self.dtype is None else x.to(self.dtype)

    def batch(self, step: int, worker: int):
        return self.inputs(step, worker), self.labels(step, worker)

    def labels(self, step: int, worker: int):
        return self.source.labels(self.indices(step, worker))

    def global_batch(self, step: int):
        import torch

        xs, ys = zip(*(self.batch(step, w) for w in range(self.n)))
        return torch.cat(xs), torch.cat(ys)

    def position(self, step: int) -> dict[str, Any]:
        """Where the stream stands before ``step`` (what a checkpoint after step−1 records)."""
        p = step * self.n * self.k
        size = self.source.size
        return {"step": step, "sample": p, "epoch": None if size is None else p // size,
                "offset": None if size is None else p % size}
