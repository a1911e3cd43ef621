"""The smallest run the CLI tests train or validate: VICReg on the digits at 8 px, a one-block ResNet of width 8 (a
real pretrain of it takes a few seconds). One module, so that the tests that only need *a* valid config share it."""

TINY_VICREG_8PX = """
method: {name: vicreg, expander: [32, 32]}
data: {dataset: digits, image_size: 8}
views:
  - {preset: minimal, num: 2, params: {crop_scale: [0.5, 1.0]}}
model:
  backbone: resnet
  params: {block: basic, layers: [1], width: 8, small_stem: true}
trainer: {max_steps: 0, batch_size: 32, progress: false}
monitor: {knn_every_steps: 0}
"""
