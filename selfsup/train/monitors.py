"""Training-health monitors: collapse statistics of embeddings and an online kNN probe."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from selfsup.eval.features import extract_features
from selfsup.eval.knn import knn_classify


@torch.no_grad()
def collapse_stats(embeddings: torch.Tensor) -> dict[str, float]:
    """Collapse indicators of a batch of embeddings ``(B, d)``.

    ``embedding_std``: mean per-dimension std of the L2-normalised embeddings, times sqrt(d)
    (SimSiam, Sec. 4.1: ~1 for well-spread embeddings, 0 for complete collapse).
    ``effective_rank``: exp of the entropy of the normalised singular values of the centred
    embeddings (RankMe, Garrido et al. 2023), between 1 and min(B, d).
    """
    z = embeddings.detach().float()
    d = z.shape[1]
    std = F.normalize(z, dim=1).std(dim=0).mean().item() * d ** 0.5
    singular = torch.linalg.svdvals(z - z.mean(dim=0))
    p = singular / singular.sum().clamp_min(1e-12)
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum()
    return {"embedding_std": std, "effective_rank": float(torch.exp(entropy))}


class KNNMonitor:
    """Weighted kNN accuracy of the backbone on a fixed labelled subset (gallery from the training
    split, queries from the held-out split), computed every few steps during pretraining."""

    def __init__(self, train_images: torch.Tensor, train_labels: torch.Tensor, test_images: torch.Tensor,
                 test_labels: torch.Tensor, normalize, k: int = 20, temperature: float = 0.07) -> None:
        self.train_images, self.train_labels = train_images, train_labels
        self.test_images, self.test_labels = test_images, test_labels
        self.normalize, self.k, self.temperature = normalize, k, temperature

    def __call__(self, backbone: nn.Module, device: torch.device) -> float:
        train = extract_features(backbone, self.train_images, device=device, transform=self.normalize)
        test = extract_features(backbone, self.test_images, device=device, transform=self.normalize)
        return knn_classify(train, self.train_labels, test, self.test_labels, k=self.k,
                            temperature=self.temperature)["top1"]
