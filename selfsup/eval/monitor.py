"""The online kNN monitor: weighted kNN accuracy of the backbone during pretraining, on a fixed labelled subset."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from selfsup.config import Config
from selfsup.data.datasets import ImageData, resolve_eval_split
from selfsup.data.stream import StreamedSplit, open_split, pixels_and_labels
from selfsup.eval.features import extract_features
from selfsup.eval.run import holdout_rows, labelled_train_split
from selfsup.eval.knn import knn_classify

log = logging.getLogger("selfsup")


class KNNMonitor:
    """Weighted kNN accuracy of the backbone on a fixed labelled subset (gallery from the training
    split, queries from the held-out split), computed every few steps during pretraining."""

    def __init__(self, train_images: torch.Tensor, train_labels: torch.Tensor, test_images: torch.Tensor,
                 test_labels: torch.Tensor, normalize: Callable[[torch.Tensor], torch.Tensor], k: int = 20,
                 temperature: float = 0.07) -> None:
        self.train_images, self.train_labels = train_images, train_labels
        self.test_images, self.test_labels = test_images, test_labels
        self.normalize, self.k, self.temperature = normalize, k, temperature

    def __call__(self, backbone: nn.Module, device: torch.device) -> float:
        train = extract_features(backbone, self.train_images, device=device, transform=self.normalize)
        test = extract_features(backbone, self.test_images, device=device, transform=self.normalize)
        return knn_classify(train, self.train_labels, test, self.test_labels, k=self.k,
                            temperature=self.temperature)["top1"]


def build_knn_monitor(cfg: Config, data: ImageData | StreamedSplit, mean: list[float], std: list[float],
                      channels: int, image_size: int) -> KNNMonitor | None:
    """A fixed, seeded labelled subset: gallery from the training split, queries from the evaluation split as
    ``selfsup eval`` resolves it (:func:`~selfsup.data.datasets.resolve_eval_split`), or from the held-out part of
    the training split. With ``data.labels``, both are the CSV's labelled images (the pretraining data has no
    labels then)."""
    d = cfg.data
    if d.labels is not None:
        data = open_split(d, labelled_train_split(d), image_size=image_size, channels=channels, progress=False,
                          labelled=True)
    if data.labels is None:
        log.warning("monitor.knn_every_steps is set but %s/%s has no labels; the kNN monitor is off",
                    cfg.data.dataset, cfg.data.train_split)
        return None
    choice = resolve_eval_split(d, cfg.eval.holdout)
    log.info("kNN monitor: %s", choice.why)
    g = torch.Generator().manual_seed(1234)
    if choice.name is None:  # gallery and queries from disjoint parts of the training split
        fit, held_out = holdout_rows(data.labels, choice.holdout, cfg.eval.seed)
        test = data
        train_idx = fit[torch.randperm(len(fit), generator=g)[:cfg.monitor.knn_train_size]]
        test_idx = held_out[torch.randperm(len(held_out), generator=g)[:cfg.monitor.knn_test_size]]
    else:
        test = open_split(d, choice.name, image_size=image_size, channels=channels, progress=False, labelled=True)
        train_idx = torch.randperm(len(data), generator=g)[:cfg.monitor.knn_train_size]
        test_idx = torch.randperm(len(test), generator=g)[:cfg.monitor.knn_test_size]
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)

    def normalize(x: torch.Tensor) -> torch.Tensor:
        return (x - m.to(x.device)) / s.to(x.device)

    return KNNMonitor(*pixels_and_labels(data, train_idx), *pixels_and_labels(test, test_idx),
                      normalize, k=cfg.monitor.knn_k, temperature=cfg.monitor.knn_temperature)
