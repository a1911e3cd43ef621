"""A MAST run small enough for a test: four ops on the digits, a two-block ResNet, one epoch (a module of its own so
that the method's tests and the benchmark scripts' tests train the same run)."""

TINY_MAST = """
method: {name: mast, ops: [color_jitter, blur, flip, crop], embedding_dim: 32, trunk: [32], variance: softplus}
data: {dataset: digits}
views:
  - {preset: mast, num: 2, params: {crop_scale: [0.5, 1.0]}}
model:
  backbone: resnet
  params: {block: basic, layers: [1, 1], width: 8, small_stem: true}
optim: {name: adamw, lr: 0.002, warmup_epochs: 0.5}
trainer: {epochs: 1, batch_size: 64, log_every_steps: 5, progress: false}
"""
