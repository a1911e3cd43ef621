"""Linear probe on frozen features with a held-out hyperparameter search.

Protocol:
1. Split the *training* set into a fit part and a seeded, class-stratified validation part.
2. Train one softmax-regression head per (lr, weight decay) pair on the fit part and keep the
   pair with the best validation top-1 (ties: lower validation cross-entropy, then grid order).
   Test features and labels play no part in this choice.
3. Retrain with the chosen pair on the whole training set and report test top-1 / top-5.

All heads of the grid train at once, as the column blocks of one ``(D, G*C)`` matrix, the way
MAE-CT trains its 10 learning rates as parallel heads on the same frozen features (MAE-CT
App. B). The optimiser is mini-batch Adam with a cosine learning-rate schedule to zero and an L2
penalty on the weights (``weight_decay`` added to the gradient, as ``torch.optim.Adam`` does; the
bias is not decayed): the probe recipe of the multi-view small-projector paper (001 App. D: Adam,
lr 1e-3, wd 1e-6; label smoothing 0.1 in its code). Heads start at zero, so the result depends on
the seed only through the split and the mini-batch order. Features are standardised with the
per-dimension mean / std of the data being fitted by default; this is MAE-CT's non-affine
BatchNorm before the head with its statistics frozen.
"""

from __future__ import annotations

import math
from typing import Callable, Literal, Sequence

import numpy as np
import torch

from selfsup.eval.features import ArrayLike, as_feature_pair, as_feature_tensor, as_label_tensor
from selfsup.eval.knn import topk_accuracy
from selfsup.progress import track

Normalization = Literal["standardize", "l2", "none"]
_NORMALIZATIONS = ("standardize", "l2", "none")
_ADAM_BETAS = (0.9, 0.999)
_ADAM_EPS = 1e-8
_EVAL_CHUNK = 8192


def stratified_holdout(labels: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded class-stratified split of ``range(len(labels))`` into (fit, val) index arrays.

    Class c gives ``round(val_fraction * n_c)`` samples to validation, at least one (a few labels per class, as a
    user's folder has them, would give none), but always keeps at least one for fitting. Both arrays are sorted.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}.")
    rng = np.random.default_rng(seed)
    val_parts = []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_val = min(max(1, int(math.floor(val_fraction * members.size + 0.5))), members.size - 1)
        val_parts.append(members[:n_val])
    val = np.sort(np.concatenate(val_parts))
    if val.size == 0:
        raise ValueError(
            f"every class has a single labelled sample ({labels.size} in all): the hyperparameter search needs two "
            f"of a class, one to fit and one to validate; label more images."
        )
    fit = np.setdiff1d(np.arange(labels.size), val)
    return fit, val


def _normalizer(fit_feats: torch.Tensor, normalize: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Build the feature map from statistics of ``fit_feats`` only."""
    if normalize == "standardize":
        mean = fit_feats.mean(dim=0)
        std = fit_feats.std(dim=0, unbiased=False)
        std = torch.where(std > 0, std, torch.ones_like(std))
        return lambda x: (x - mean) / std
    if normalize == "l2":
        return lambda x: torch.nn.functional.normalize(x, dim=1)
    return lambda x: x


def _train_heads(
    feats: torch.Tensor,
    labels: torch.Tensor,
    lrs: torch.Tensor,
    weight_decays: torch.Tensor,
    num_classes: int,
    epochs: int,
    batch_size: int,
    label_smoothing: float,
    seed: int,
    progress: str | None = None,
    min_steps: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Train G softmax-regression heads at once; returns weights ``(D, G*C)`` and biases ``(G*C,)``.

    Head g (columns g*C .. g*C+C-1) minimises mean CE(label_smoothing) + weight_decays[g] / 2 *
    ||W_g||^2 with Adam at lr_t = lrs[g] * (1 + cos(pi * t / T)) / 2 for step t = 0..T-1, where T is
    ``epochs`` passes over the data or ``min_steps`` steps, whichever is more (the last pass may be
    cut short). The CE gradient is the closed form (softmax - smoothed one-hot) / B, so no autograd
    graph is built, and all heads share one matrix product per step. ``progress``: a bar's label, or None.
    """
    num_heads, num = lrs.shape[0], feats.shape[0]
    device = feats.device
    weight = torch.zeros(feats.shape[1], num_heads * num_classes, device=device)
    bias = torch.zeros(num_heads * num_classes, device=device)
    params = (weight, bias)
    first = [torch.zeros_like(p) for p in params]
    second = [torch.zeros_like(p) for p in params]
    beta1, beta2 = _ADAM_BETAS
    column_lrs = lrs.repeat_interleave(num_classes)
    column_decay = weight_decays.repeat_interleave(num_classes)
    smooth_off = label_smoothing / num_classes
    hit = torch.full((1, num_heads, 1), label_smoothing - 1.0, device=device)
    generator = torch.Generator().manual_seed(seed)
    per_epoch = math.ceil(num / batch_size)
    total = max(epochs * per_epoch, min_steps)
    step = 0
    for _ in track(range(math.ceil(total / per_epoch)), progress or "", unit="epochs", enabled=progress is not None,
                   leave=False):
        order = torch.randperm(num, generator=generator).to(device)
        epoch_labels = labels[order]
        for start in range(0, num, batch_size):
            if step == total:
                break
            x = feats.index_select(0, order[start : start + batch_size])
            y = epoch_labels[start : start + batch_size, None, None].expand(-1, num_heads, 1)
            probs = torch.addmm(bias, x, weight).view(-1, num_heads, num_classes).softmax(dim=2)
            probs.sub_(smooth_off).scatter_add_(2, y, hit.expand(y.shape[0], -1, -1))
            grad_logits = probs.view(x.shape[0], -1).div_(x.shape[0])
            grads = (torch.addmm(weight * column_decay, x.T, grad_logits), grad_logits.sum(dim=0))
            lr_t = column_lrs * (0.5 * (1.0 + math.cos(math.pi * step / total)))
            step += 1
            correction1 = 1.0 - beta1**step
            correction2 = 1.0 - beta2**step
            for param, grad, m, v in zip(params, grads, first, second):
                m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                denom = v.div(correction2).sqrt_().add_(_ADAM_EPS)
                param.sub_(m.div(denom).mul_(lr_t / correction1))
    return weight, bias


def _head_logits(feats: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Logits ``(G, N, C)`` of every head, computed in chunks of samples."""
    parts = [torch.addmm(bias, feats[s : s + _EVAL_CHUNK], weight) for s in range(0, feats.shape[0], _EVAL_CHUNK)]
    return torch.cat(parts).view(feats.shape[0], -1, num_classes).transpose(0, 1)


def _check_grid(values: Sequence[float], name: str, allow_zero: bool) -> list[float]:
    values = [float(v) for v in values]
    if not values:
        raise ValueError(f"{name} is empty; pass at least one value.")
    bad = [v for v in values if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero)]
    if bad:
        limit = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {limit}, got {bad}.")
    return values


def linear_probe(
    train_feats: ArrayLike,
    train_labels: ArrayLike,
    test_feats: ArrayLike,
    test_labels: ArrayLike,
    *,
    lrs: Sequence[float] = (1e-3, 3e-3, 1e-2),
    weight_decays: Sequence[float] = (0.0, 1e-4),
    epochs: int = 20,
    min_steps: int = 5000,
    batch_size: int = 256,
    val_fraction: float = 0.1,
    label_smoothing: float = 0.0,
    normalize: Normalization = "standardize",
    num_classes: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """Linear-probe accuracy (percent) with hyperparameters chosen on held-out training data.

    Returns ``{"top1", "top5", "val_top1", "best_lr", "best_wd", "train_objective"}``: test accuracies of
    the head retrained on all training data, the validation top-1 of the chosen pair in the search,
    and the retrained head's objective on the training data (mean cross-entropy + wd / 2 ||W||^2,
    label smoothing included). Every head trains for ``epochs`` passes or ``min_steps`` Adam steps,
    whichever is more: a few hundred labels make a few steps per pass, and 20-30 passes then stop
    far short of the optimum (on 1,500 digits, 180 steps left the objective 0.1 above it and the
    accuracy 2.7 points below; 5,000 steps reach it within 1e-3).
    ``normalize``: "standardize" (per-dimension, statistics of the data being fitted), "l2"
    (per-sample unit norm; MSN's probe L2-normalises after a LayerNorm), or "none". ``device=None`` keeps the features'
    device. Deterministic for a fixed ``seed`` on a given device. ``progress`` shows a bar per training pass.
    """
    train, test = as_feature_pair(train_feats, test_feats)
    train_y = as_label_tensor(train_labels, train.shape[0], "train_labels")
    test_y = as_label_tensor(test_labels, test.shape[0], "test_labels")
    largest = int(max(train_y.max(), test_y.max())) + 1
    if num_classes is None:
        num_classes = largest
    elif not isinstance(num_classes, int) or num_classes < largest:
        raise ValueError(f"num_classes={num_classes!r} but labels go up to {largest - 1}; pass None to infer it.")
    lr_grid = _check_grid(lrs, "lrs", allow_zero=False)
    wd_grid = _check_grid(weight_decays, "weight_decays", allow_zero=True)
    if normalize not in _NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {_NORMALIZATIONS}, got {normalize!r}.")
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}.")
    if not isinstance(min_steps, int) or min_steps < 0:
        raise ValueError(f"min_steps must be a non-negative integer, got {min_steps!r}.")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}.")

    target = torch.device(device) if device is not None else train.device
    train, train_y = train.to(target), train_y.to(target)
    pairs = [(lr, wd) for lr in lr_grid for wd in wd_grid]
    pair_lrs = torch.tensor([p[0] for p in pairs], device=target)
    pair_wds = torch.tensor([p[1] for p in pairs], device=target)
    fit_idx, val_idx = stratified_holdout(train_y.cpu().numpy(), val_fraction, seed)
    fit_idx = torch.from_numpy(fit_idx).to(target)
    val_idx = torch.from_numpy(val_idx).to(target)

    # 1-2: grid search on the held-out part of the training set.
    fit_x = train[fit_idx]
    norm = _normalizer(fit_x, normalize)
    fit_x, val_x = norm(fit_x), norm(train[val_idx])
    weight, bias = _train_heads(
        fit_x, train_y[fit_idx], pair_lrs, pair_wds, num_classes, epochs, batch_size, label_smoothing, seed,
        progress=f"linear probe: {len(pairs)} (lr, wd) pairs" if progress else None, min_steps=min_steps,
    )
    val_logits = _head_logits(val_x, weight, bias, num_classes)
    val_y = train_y[val_idx]
    val_top1 = (val_logits.argmax(dim=2) == val_y).float().mean(dim=1)
    val_loss = torch.stack([torch.nn.functional.cross_entropy(lg, val_y) for lg in val_logits])
    best = min(range(len(pairs)), key=lambda g: (-float(val_top1[g]), float(val_loss[g]), g))
    best_lr, best_wd = pairs[best]

    # 3: retrain on the whole training set, then (only now) read the test set.
    norm = _normalizer(train, normalize)
    weight, bias = _train_heads(
        norm(train),
        train_y,
        pair_lrs[best : best + 1],
        pair_wds[best : best + 1],
        num_classes,
        epochs,
        batch_size,
        label_smoothing,
        seed,
        progress="linear probe: final head" if progress else None,
        min_steps=min_steps,
    )
    train_logits = _head_logits(norm(train), weight, bias, num_classes)[0]
    objective = (torch.nn.functional.cross_entropy(train_logits, train_y, label_smoothing=label_smoothing)
                 + best_wd / 2 * weight.square().sum())
    test_logits = _head_logits(norm(test.to(target)), weight, bias, num_classes)[0]
    result = topk_accuracy(test_logits, test_y, ks=(1, 5))
    result.update(val_top1=100.0 * float(val_top1[best]), best_lr=best_lr, best_wd=best_wd,
                  train_objective=float(objective))
    return result
