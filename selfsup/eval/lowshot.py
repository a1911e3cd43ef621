"""Low-shot evaluation: L2-regularised logistic regression on a few labels per class.

The MSN protocol (MSN App. A.2, Tab. 1/2; also used by DINO and MAE-CT): take k labelled images
per class (k = 1, 2, 5; 3 fixed random splits, mean +- std) or a class-balanced 1 % subset, fit
a multinomial logistic regression with an L2 penalty and no intercept on frozen features, and
report top-1 on the full test set. MSN runs cyanure with
``preprocess(centering=True, normalize=True, columns=False)``, which acts on *rows*: each
feature vector is centred by its own mean over dimensions and then L2-normalised (not centred
with a dataset mean); the test features get the same per-sample map. We fit the same objective
with scikit-learn's lbfgs solver.

Regularisation: cyanure minimises (1/n) sum_i CE_i + (lambda/2) ||W||^2 with lambda = lambd / n
(MSN script default lambd = 2.5e-4); scikit-learn minimises C sum_i CE_i + (1/2) ||W||^2, which is
the same problem for C = 1 / lambd, independent of n. Hence the default ``C = 4000``.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from selfsup.eval.features import ArrayLike, as_feature_tensor, as_label_tensor
from selfsup.progress import Progress

MSN_LAMBD = 2.5e-4
DEFAULT_C = 1.0 / MSN_LAMBD


def lowshot_splits(labels: ArrayLike, shots: int, num_splits: int = 3, seed: int = 0) -> list[np.ndarray]:
    """``num_splits`` index sets with exactly ``shots`` samples of every class present in ``labels``.

    Split i draws, for each class, ``shots`` indices without replacement from
    ``numpy.random.default_rng(seed + i)``, so splits are fixed by the seed. Indices are sorted.
    """
    labels_np = as_label_tensor(labels).numpy()
    if not isinstance(shots, int) or shots < 1:
        raise ValueError(f"shots must be a positive integer, got {shots!r}.")
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive integer, got {num_splits!r}.")
    classes, counts = np.unique(labels_np, return_counts=True)
    short = {int(c): int(n) for c, n in zip(classes, counts) if n < shots}
    if short:
        raise ValueError(
            f"{shots}-shot splits need {shots} samples per class, but these classes have fewer "
            f"(class: count): {short}; lower `shots` or add labelled samples."
        )
    members = [np.flatnonzero(labels_np == c) for c in classes]
    splits = []
    for i in range(num_splits):
        rng = np.random.default_rng(seed + i)
        chosen = [rng.choice(m, size=shots, replace=False) for m in members]
        splits.append(np.sort(np.concatenate(chosen)))
    return splits


def percent_split(labels: ArrayLike, percent: float, seed: int = 0) -> np.ndarray:
    """Class-balanced ``percent`` % subset: class c keeps ``max(1, round(percent/100 * n_c))`` samples.

    Rounding is half-up. Drawn without replacement with ``numpy.random.default_rng(seed)``;
    indices are sorted. ``percent=1.0`` is the analogue of the ImageNet 1 % split (~13 per class).
    """
    labels_np = as_label_tensor(labels).numpy()
    if not (isinstance(percent, (int, float)) and 0.0 < percent <= 100.0):
        raise ValueError(f"percent must be in (0, 100] (e.g. 1.0 for 1 %), got {percent!r}.")
    rng = np.random.default_rng(seed)
    chosen = []
    for cls in np.unique(labels_np):
        members = np.flatnonzero(labels_np == cls)
        take = max(1, int(math.floor(percent / 100.0 * members.size + 0.5)))
        chosen.append(rng.choice(members, size=take, replace=False))
    return np.sort(np.concatenate(chosen))


def center_normalize(feats: ArrayLike) -> torch.Tensor:
    """Per-sample centring over feature dimensions, then L2 normalisation (cyanure rows mode).

    ``x -> (x - mean(x)) / ||x - mean(x)||``; a constant vector maps to zeros.
    """
    x = as_feature_tensor(feats).double()
    x = x - x.mean(dim=1, keepdim=True)
    norms = x.norm(dim=1, keepdim=True)
    return x / torch.where(norms > 0, norms, torch.ones_like(norms))


def _fit_and_score(
    train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, C: float, max_iter: int
) -> float:
    if np.unique(train_y).size < 2:
        raise ValueError("the labelled subset holds a single class; logistic regression needs at least 2 classes.")
    model = LogisticRegression(C=C, fit_intercept=False, solver="lbfgs", max_iter=max_iter)
    model.fit(train_x, train_y)
    return 100.0 * float(np.mean(model.predict(test_x) == test_y))


def _summary(prefix: str, accs: list[float]) -> dict[str, float | list[float]]:
    return {
        f"{prefix}_mean": float(np.mean(accs)),
        f"{prefix}_std": float(np.std(accs)),
        f"{prefix}_splits": [float(a) for a in accs],
    }


def lowshot_logistic(
    train_feats: ArrayLike,
    train_labels: ArrayLike,
    test_feats: ArrayLike,
    test_labels: ArrayLike,
    *,
    shots: Sequence[int] = (1, 2, 5, 10),
    percents: Sequence[float] = (1.0,),
    num_splits: int = 3,
    seed: int = 0,
    C: float = DEFAULT_C,
    max_iter: int = 1000,
    progress: bool = False,
) -> dict[str, float | list[float]]:
    """Low-shot top-1 (percent) for each k-shot and percent setting, over ``num_splits`` splits.

    Keys per setting, e.g. ``1shot_mean``, ``1shot_std`` (population std over splits),
    ``1shot_splits`` (per-split list), and ``1pct_mean`` / ``1pct_std`` / ``1pct_splits``.
    Split i of every setting uses seed ``seed + i`` (MSN uses a single fixed 1 % split: pass
    ``num_splits=1`` to match). Features are per-sample centred and L2-normalised
    (:func:`center_normalize`); ``C`` is scikit-learn's inverse L2 strength (module docstring).
    ``progress`` shows a bar over the fits.
    """
    train = center_normalize(as_feature_tensor(train_feats, "train_feats"))
    test = center_normalize(as_feature_tensor(test_feats, "test_feats"))
    if train.shape[1] != test.shape[1]:
        raise ValueError(
            f"train_feats has {train.shape[1]} dims but test_feats has {test.shape[1]}; "
            "extract both with the same backbone."
        )
    train_y = as_label_tensor(train_labels, train.shape[0], "train_labels").numpy()
    test_y = as_label_tensor(test_labels, test.shape[0], "test_labels").numpy()
    if not C > 0:
        raise ValueError(f"C must be > 0, got {C!r}.")
    if not shots and not percents:
        raise ValueError("pass at least one entry in `shots` or `percents`.")
    train_np, test_np = train.cpu().numpy(), test.cpu().numpy()

    settings = [(f"{k}shot", lowshot_splits(train_y, k, num_splits, seed)) for k in shots]
    settings += [
        (f"{p:g}pct", [percent_split(train_y, p, seed + i) for i in range(num_splits)]) for p in percents
    ]
    result: dict[str, float | list[float]] = {}
    with Progress("low-shot fits", sum(len(s) for _, s in settings), unit="fits", enabled=progress,
                  leave=False) as bar:
        for prefix, splits in settings:
            accs = []
            for idx in splits:
                accs.append(_fit_and_score(train_np[idx], train_y[idx], test_np, test_y, C, max_iter))
                bar.advance()
            result.update(_summary(prefix, accs))
    return result
