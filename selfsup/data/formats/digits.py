"""scikit-learn's 8 x 8 digits (1,797 images, no files needed): the first 1,500 train, the rest test."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from selfsup.data.imagedata import ImageData, take

_DIGITS_TRAIN = 1500


def load_digits(split: str, select: Callable[[int], torch.Tensor | None]) -> ImageData:
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    pixels = np.rint(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    part = slice(0, _DIGITS_TRAIN) if split == "train" else slice(_DIGITS_TRAIN, None)
    images = torch.from_numpy(pixels[part].copy()).unsqueeze(1)
    labels = torch.from_numpy(bunch.target[part].astype(np.int64))
    images, labels = take(images, labels, select(len(images)))
    return ImageData(images.contiguous(), labels, [str(i) for i in range(10)], [])
