"""selfsup's side of ../shared/anchors-bench/bench.py: the MSN and ExtreMA steps its official.py builds from the
authors' code, built here from selfsup's own pieces (same model, same synthetic input, same machine).

    cd ../shared/anchors-bench
    python bench.py --anchors /tmp/anchors --impl-module $REPO/benchmarks/anchors_impl.py --impls official,selfsup

MSN: ViT-Tiny (192/12/3), patch 4, 32 px, head 2048-2048-256 (BN, GELU), 1024 prototypes, tau 0.1, sharpen 0.025,
Sinkhorn 3, ME-MAX 1, AdamW (lr/wd as official), clip 3.0, EMA after the step.
ExtreMA: the same ViT-Tiny with 2 class-attention blocks (LayerScale 0.1) and drop path 0.1 on the student,
projector 4096-4096-256 and predictor 4096-256 (LayerNorm, GELU), mask ratio 0.8 with ``num_masks`` disjoint masks,
BYOL loss, AdamW (lr 1.5e-4 x batch / 256, wd 0.1, betas 0.9/0.95, no clipping: the official README recipe), EMA.
Inputs are fixed randn tensors of the official shapes, so no augmentation is timed on either side.
(The MSN builder is anchors-bench's selfsup_impl.py; the ExtreMA builder is new.)
"""
from __future__ import annotations

import torch

from selfsup.config import OptimConfig
from selfsup.methods.extrema import ExtreMA, ExtreMAConfig
from selfsup.methods.msn import MSN, MSNConfig
from selfsup.models.vit import VisionTransformer
from selfsup.train.optim import build_optimizer


def _vit_tiny(cfg: dict, **kwargs) -> VisionTransformer:
    return VisionTransformer(img_size=cfg["img"], patch_size=cfg["patch"], in_channels=3, embed_dim=192, depth=12,
                             num_heads=3, **kwargs)


def _stepper(model, opt, views, clip: float | None, wrapped=None):
    state = {"i": 0}
    forward = wrapped if wrapped is not None else model

    def step() -> float:
        out = forward(views)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        model.after_step(state["i"])
        state["i"] += 1
        return float(out.loss.detach())

    return step


def build_msn(cfg: dict, opts) -> tuple:
    torch.manual_seed(0)
    b, img = cfg["batch"], cfg["img"]
    focal = cfg.get("focal", 0)
    mcfg = MSNConfig(projector=[2048, 2048, 256], num_prototypes=1024, sinkhorn_iterations=3, memax_weight=1.0,
                     mask_ratio=cfg["mask"], masked_views=1, shared_mask=bool(getattr(opts, "shared_mask", False)))
    model = MSN(_vit_tiny(cfg, pos_embed="learned"), mcfg, total_steps=1000).train()
    opt = build_optimizer(model, OptimConfig(name="adamw", lr=1e-3, weight_decay=0.04, weight_decay_end=0.4,
                                             clip_grad=3.0))
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(b, 3, img, img, generator=g), torch.randn(b, 3, img, img, generator=g)]
    views += [torch.randn(b, 3, cfg.get("focal_img", 16), cfg.get("focal_img", 16), generator=g) for _ in range(focal)]
    params = sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6
    return _stepper(model, opt, views, 3.0), {"params_M": round(params, 3), "selfsup_shared_mask": mcfg.shared_mask}


def build_extrema(cfg: dict, opts) -> tuple:
    torch.manual_seed(0)
    b, img = cfg["batch"], cfg["img"]
    vit = _vit_tiny(cfg, num_class_attention_blocks=2, layer_scale_init=0.1, drop_path_rate=0.1)
    mcfg = ExtreMAConfig(projector=[4096, 4096, 256], predictor=[4096, 256], mask_ratio=cfg["mask"],
                         num_masks=cfg["num_masks"])
    model = ExtreMA(vit, mcfg, total_steps=300_000).train()
    opt = build_optimizer(model, OptimConfig(name="adamw", lr=1.5e-4 * b / 256, weight_decay=0.1, betas=[0.9, 0.95]))
    wrapped = None
    if cfg.get("ddp"):  # one gloo process, as official.py does for its DDP configuration
        import socket

        import torch.distributed as dist
        if not dist.is_initialized():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(b, 3, img, img, generator=g) for _ in range(2)]  # student view, teacher view
    params = (sum(p.numel() for p in model.encoder.parameters()) + sum(p.numel() for p in model.projector.parameters())
              + sum(p.numel() for p in model.predictor.parameters())) / 1e6
    n_tok = (img // cfg["patch"]) ** 2
    return _stepper(model, opt, views, None, wrapped), {
        "params_M": round(params, 3), "tokens": n_tok, "kept_tokens_per_mask": int(n_tok * (1 - cfg["mask"])),
        "ddp": bool(cfg.get("ddp")), "disjoint": mcfg.disjoint}


IMPLS = {"selfsup": {"msn": build_msn, "extrema": build_extrema}}
