"""MAST: masked augmentation subspace training (Huang, Goh, Gu & Susskind, ICLR 2023, arXiv 2303.03679).

VICReg with one learned non-negative mask per augmentation over a Gaussian embedding (§3.1):

    active = the augmentations drawn for each pair (the same for both views; schedule of §3.2:
             one at a time for the first half of training, then 1 -> K composed)
    v, v'  = augment(x, active), augment(x, active)      # each op with its probability, own magnitudes
    (mu, var), (mu', var') = g(f(v)), g(f(v'))            # GeM heads: mean, and diagonal variance (ReLU)
    loss = lambda D_mg(mu, var, mu', var'; M, active) + lambda1 ||M||_1 + lambda2 symKL + alpha l_var + beta l_cov

M = ReLU(U) (App. A). Only the encoder f is exported: masks, heads and trunk are discarded.

The method draws its own pairs (``make_views``): Eq. 4 needs to know which augmentations each pair
got. The config's single view spec (``num: 2``) gives the ops' probabilities and magnitude ranges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from torch import nn

from selfsup.config import ConfigError, NonNegative, Probability, Width, check_fields
from selfsup.data.augment import MAST15_OPS, MAST_OPS, LabelledAugment, sample_op_subsets
from selfsup.data.views import ViewGroup
from selfsup.losses.mast import init_masks, mast_loss
from selfsup.methods.base import MethodBase, MethodConfig, StepOutput, check_values
from selfsup.models.heads import GaussianHead
from selfsup.train.schedules import augmentation_count_schedule


@dataclass
class MASTConfig(MethodConfig):
    VIEWS: ClassVar[tuple[int, int | None]] = (2, 2)  # views per image (least, most), checked on load
    # One mask per op, in this order: MAST-5 (the default) or any of MAST15_OPS (MAST-15: all of them).
    ops: list[str] = field(default_factory=lambda: list(MAST_OPS))
    embedding_dim: Width = 4096  # d
    trunk: list[Width] = field(default_factory=lambda: [8192, 8192])  # shared trunk (two FC layers of 8192)
    # gem: the trunk runs position-wise on the encoder's feature map and each head GeM-pools it (App. A);
    # avg: the trunk runs on the average-pooled feature (the spec's cheap small-scale variant).
    pooling: Literal["gem", "avg"] = "gem"
    # The covariance head's activation: relu (App. A) can output exact zeros, which Eq. 6 divides by (guarded by
    # 1e-6); softplus keeps every variance positive (a deviation, spec §6.3).
    variance: Literal["relu", "softplus"] = "relu"
    first_stage: Probability = 0.5  # fraction of the run with one augmentation at a time (§3.2: 500 of 1000 epochs)
    invariance_weight: NonNegative = 25.0  # lambda = 25 d / K_active
    sparsity_weight: NonNegative = 600.0  # lambda1 = 600 / (d K)
    kl_weight: NonNegative = 25.0  # lambda2
    var_weight: NonNegative = 25.0  # alpha
    cov_weight: NonNegative = 1.0  # beta
    # Off: Eq. 7 as printed. On: D_mg ignores the overall scale of the masks and of the variances (the loss can
    # otherwise fall by shrinking every mask or inflating every variance; losses/mast.py, spec §6.4).
    scale_free: bool = False
    # What the guard divides the variances by (losses/mast.py): their mean over the batch and every dimension
    # ("batch"), or each dimension's mean over the batch ("dimension": the head cannot pile variance onto the
    # dimensions the masks select). Only read with scale_free.
    variance_scale: Literal["batch", "dimension"] = "batch"
    # LARS's trust ratio on the masks' U (with optim.name: lars). On: every step moves U by a fixed fraction of its
    # norm, whatever the size of its gradient (at the ImageNet presets' lr 1.6 an unscaled step moved mask entries by
    # ~6x their size). Off: plain SGD with momentum, so the small L1 gradient (lambda1 = 600 / (d K)) moves the masks
    # slowly instead of at LARS's pace.
    masks_lars: bool = True
    crop_p: Probability = 1.0  # RandomResizedCrop's probability when drawn (torchvision's is 1)
    extra_p: Probability = 0.5  # probability of each MAST-15 extra op when drawn (the paper gives none; the spec's default)
    # Which subspaces Eq. 4 trains for a pair: "drawn" (the ops sampled for it, the paper's wording) or "applied" (the
    # drawn ops that fired on at least one of its two views: a drawn op fires with its probability, e.g. flip 0.5,
    # grayscale 0.2, so many "drawn" labels name an op neither view got). On CIFAR-10 at 499 steps the two were within
    # a point of each other, of both signs (docs/benchmarks.md), so the default stays "drawn".
    labels: Literal["drawn", "applied"] = "drawn"

    def __post_init__(self) -> None:
        check_fields(self, "method.")
        unknown = [op for op in self.ops if op not in MAST15_OPS]
        check_values(self, {"ops": bool(self.ops) and not unknown and len(set(self.ops)) == len(self.ops)},
                     {"ops": f"a list of distinct augmentations out of {list(MAST15_OPS)}"})



class MAST(MethodBase):
    Config = MASTConfig
    OWN_VIEWS = True  # Eq. 4 needs to know which augmentations each pair got

    def __init__(self, backbone: nn.Module, cfg: MASTConfig, total_steps: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone
        self.projector = GaussianHead(backbone.num_features, cfg.embedding_dim, cfg.trunk, cfg.variance)
        self.mask_params = nn.Parameter(init_masks(cfg.embedding_dim, len(cfg.ops)))  # U; M = ReLU(U)
        # No weight decay: the L1 term (lambda1 ||M||_1) is their penalty, and decay on U would also pull the dead
        # (negative) entries of U towards 0, reviving them. LARS's trust ratio as for any 2-D weight unless
        # masks_lars is off (then plain SGD with momentum, as LARS gives biases and norms).
        self.mask_params._no_weight_decay = True  # type: ignore[attr-defined]
        self.mask_params._lars_without_weight_decay = cfg.masks_lars  # type: ignore[attr-defined]
        self.extended = any(op not in MAST_OPS for op in cfg.ops)  # MAST-15 ops in use
        self.op_columns = [(MAST15_OPS if self.extended else MAST_OPS).index(op) for op in cfg.ops]
        self.register_buffer("op_counts", torch.from_numpy(augmentation_count_schedule(
            len(cfg.ops), max(total_steps, 1), cfg.first_stage)), persistent=False)
        self.augment: LabelledAugment | None = None
        self.active: torch.Tensor | None = None  # (B, K) of the pairs made by the last make_views
        self.drawn_ops: list[bool] | None = None  # per op: does a pair of the last make_views have it (labels drawn)

    @property
    def masks(self) -> torch.Tensor:
        return torch.relu(self.mask_params)

    def attach_views(self, groups: list[ViewGroup]) -> None:
        """Take the augmentation config of the run's one view spec (``num: 2``) for the labelled pairs."""
        if len(groups) != 1 or groups[0].num != 2 or groups[0].crop is not None:
            raise ConfigError("MAST makes its own pair of views: give one view spec with num: 2 and no "
                              "shared_crop, e.g. views: [{preset: mast, num: 2}]")
        mean = groups[0].augment.config.mean
        if mean is not None:
            self.check_ops_act_on(len(mean))
        self.augment = LabelledAugment(groups[0].augment.config, crop_p=self.cfg.crop_p,
                                       extra_p=self.cfg.extra_p if self.extended else None).to(self.mask_params.device)

    def check_ops_act_on(self, channels: int) -> None:
        """Refuse ops that cannot change an image of ``channels`` channels: a mask for them would learn nothing."""
        if channels == 1 and "grayscale" in self.cfg.ops:
            raise ConfigError("bad value for method.ops: grayscale cannot act on 1-channel images (its mask would "
                              "train on pairs the op never changed); drop it from method.ops, e.g. "
                              f"{[op for op in self.cfg.ops if op != 'grayscale']}")

    def make_views(self, images: torch.Tensor, step: int) -> list[torch.Tensor]:
        """Two views of ``images`` ([0, 1]) made with the same drawn augmentations; remembers each pair's labels for
        Eq. 4: the drawn ops, or (``labels: applied``) those that fired on at least one of the two views."""
        if self.augment is None:
            raise RuntimeError("MAST.attach_views(view_groups) must be called before make_views")
        self.check_ops_act_on(images.shape[1])
        count = int(self.op_counts[min(step, len(self.op_counts) - 1)])
        active = sample_op_subsets(len(images), len(self.cfg.ops), count)
        enabled = torch.zeros(len(images), len(self.augment.ops), dtype=torch.bool)
        enabled[:, self.op_columns] = active
        (view_a, applied_a), (view_b, applied_b) = (self.augment(images, enabled) for _ in range(2))
        # which ops a pair has, known here on the host for the drawn labels (made on the CPU): the diagnostics name
        # them without reading the device (the applied labels are the augmentation's, on the device)
        self.drawn_ops = active.any(dim=0).tolist() if self.cfg.labels == "drawn" else None
        if self.cfg.labels == "applied":
            active = (applied_a | applied_b)[:, self.op_columns]
        self.active = active.to(images.device)
        return [view_a, view_b]

    def embed(self, view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian embedding (mu, diagonal of Sigma) of a batch of views: GeM over the feature map or the
        backbone's pooled vector (``pooling``), then the head."""
        encode = self.backbone.forward_feature_map if self.cfg.pooling == "gem" else self.backbone
        return self.projector(encode(view))

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        if self.active is None or len(self.active) != len(views[0]):
            raise RuntimeError("MAST.forward needs the pairs of make_views (the engine calls it every step)")
        (mu_a, var_a), (mu_b, var_b) = (self.embed(view) for view in views)
        masks = self.masks
        loss, terms = mast_loss(mu_a, var_a, mu_b, var_b, masks, self.active, self.cfg.invariance_weight,
                                self.cfg.sparsity_weight, self.cfg.kl_weight, self.cfg.var_weight, self.cfg.cov_weight,
                                self.cfg.scale_free, self.cfg.variance_scale)
        return StepOutput(loss, {**terms, **self.diagnostics(var_a, var_b)}, mu_a.detach())

    @torch.no_grad()
    def diagnostics(self, var_a: torch.Tensor, var_b: torch.Tensor) -> dict[str, torch.Tensor]:
        """The degenerate directions of Eq. 7 (spec §6.4), watched: mask size and dead entries, mean tr(Sigma),
        and per augmentation the mean tr(Sigma) of the views whose pair drew it (the paper's Fig. 5)."""
        trace = 0.5 * (var_a.sum(1) + var_b.sum(1))
        out = {"mask_mean": self.masks.mean(), "mask_dead": (self.mask_params <= 0).float().mean(),
               "sigma_trace": trace.mean()}
        active = self.active.to(trace.dtype)
        has_op = self.drawn_ops if self.drawn_ops is not None else self.active.any(dim=0).tolist()
        for k, op in enumerate(self.cfg.ops):
            if has_op[k]:
                out[f"uncertainty_{op}"] = (trace * active[:, k]).sum() / active[:, k].sum()
        return out
