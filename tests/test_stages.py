"""Staged runs (MAE-CT: MAE -> head initialisation on the frozen encoder -> contrastive tuning), through the CLI:
stage directories, carried weights, frozen parts, the stage column, and a kill in stage 3 resumed exactly."""

from __future__ import annotations

import csv
import json
import logging
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from selfsup.cli import main
from selfsup.config import ConfigError, stage_configs
from selfsup.load import load_config
from test_reliability import SIGNAL_IN_OPTIMIZER_STEP, cli, finish

VIEWS2 = "[{preset: minimal, num: 2, params: {crop_scale: [0.5, 1.0]}}]"
HEADS = "projector: [32, 32, 8], predictor: [16, 8], queue_size: 128, temperature: 0.15"
STAGED = f"""
method: {{name: mae, mask_ratio: 0.75, decoder_dim: 16, decoder_depth: 1, decoder_heads: 2}}
data: {{dataset: digits}}
views: [{{preset: minimal, num: 1, params: {{crop_scale: [0.5, 1.0]}}}}]
model: {{backbone: vit_custom, params: {{patch_size: 2, embed_dim: 16, depth: 2, num_heads: 2, pool: mean}}}}
optim: {{name: adamw, lr: 0.002, warmup_fraction: 0.1, weight_decay: 0.05}}
trainer: {{max_steps: 6, batch_size: 64, log_every_steps: 2, checkpoint_every_steps: 2, progress: false}}
monitor: {{collapse_every_steps: 0}}
eval: {{linear_epochs: 2, lowshot_shots: [1], lowshot_splits: 1, cluster_n_init: 1}}
stages:
  - {{name: mae}}
  - name: head
    method: {{name: nnclr, {HEADS}}}
    views: {VIEWS2}
    model: {{freeze: all}}
    trainer: {{max_steps: 4}}
  - name: ct
    method: {{name: nnclr, {HEADS}, topk: 3, projector_momentum: 0.9, encoder_momentum: 0.9}}
    views: {VIEWS2}
    model: {{freeze: 1}}
    optim: {{layer_decay: 0.65, head_weight_decay: 1.0e-5}}
    trainer: {{max_steps: 8}}
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "staged.yaml"
    path.write_text(STAGED)
    return path


@pytest.fixture(scope="module")
def reference(config, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("reference") / "run"
    code, err = finish(cli(["pretrain", str(config), f"trainer.out={run}"]))
    assert code == 0, err[-3000:]
    (run.parent / "stderr.txt").write_text(err)
    return run


def test_each_later_stage_logs_what_it_carried_over_and_what_starts_afresh(reference):
    err = (reference.parent / "stderr.txt").read_text()
    assert re.search(r"carried over \d+ tensors \(encoder\); initialised afresh: predictor, projector, queue\n", err)
    assert re.search(r"carried over \d+ tensors \(encoder, predictor, projector, queue\); "
                     r"initialised afresh: encoder_ema, projector_ema\n", err)


def _model(stage_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(stage_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["model"]


def test_stages_run_in_order_carry_weights_and_keep_frozen_parts(reference):
    stages = reference / "stages"
    assert sorted(p.name for p in stages.iterdir()) == ["1_mae", "2_head", "3_ct"]
    mae, head, ct = (_model(stages / name) for name in ("1_mae", "2_head", "3_ct"))
    encoder = [k for k in mae if k.startswith("encoder.")]
    assert all(torch.equal(mae[k], head[k]) for k in encoder)  # stage 2: the whole encoder frozen
    lower = [k for k in encoder if k.startswith(("encoder.patch_embed", "encoder.cls_token", "encoder.blocks.0."))]
    upper = [k for k in encoder if k.startswith("encoder.blocks.1.")]
    assert lower and all(torch.equal(head[k], ct[k]) for k in lower)  # stage 3: stem + lower half frozen
    assert any(not torch.equal(head[k], ct[k]) for k in upper)
    assert not torch.equal(head["queue.features"], ct["queue.features"])  # the queue moved on
    # frozen parameters hold no optimiser state: stage 3's state covers exactly its trainable parameters
    optimizer = torch.load(stages / "3_ct" / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["optimizer"]
    trainable = {k for k in ct if k.startswith(("encoder.blocks.1.", "encoder.norm.", "projector.", "predictor."))
                 and not k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    assert len(optimizer["state"]) == len(trainable)
    # and the optimiser holds nothing else: a frozen parameter in a group (no gradient, so no state) would show here
    assert sum(len(g["params"]) for g in optimizer["param_groups"]) == len(trainable)
    scales = sorted({round(g["lr_scale"], 6) for g in optimizer["param_groups"]})
    assert scales == [0.65, 1.0]  # block 1 of 2: 0.65^(2 - 1); final norm and heads 1
    head_wd = [g["wd_scale"] for g in optimizer["param_groups"] if g["lr_scale"] == 1.0 and g["apply_weight_decay"]]
    assert head_wd == [pytest.approx(1e-5 / 0.05)]  # the heads' own weight decay (the final norm has none)
    # the run's backbone is stage 3's EMA encoder; metrics rows carry their stage
    exported = load_file(reference / "backbone.safetensors")
    assert all(torch.equal(exported[k], ct[f"encoder_ema.module.{k}"]) for k in exported)
    meta = json.loads((reference / "backbone.json").read_text())
    assert [s["stage"] for s in meta["stages"]] == ["mae", "head", "ct"] and meta["steps"] == 8
    with (reference / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["stage"] for r in rows] == ["mae"] * 3 + ["head"] * 2 + ["ct"] * 4
    assert (stages / "1_mae" / "plots" / "mae_reconstruction.png").is_file()


def test_a_kill_in_stage_3_resumes_at_stage_3_exactly(config, reference, tmp_path, caplog):
    run = tmp_path / "run"
    # optimiser steps: 6 (mae) + 4 (head) + 3 in ct, then SIGINT inside the 13th step
    code, err = finish(cli(["pretrain", str(config), f"trainer.out={run}"], SIGNAL_IN_OPTIMIZER_STEP.format(k=13, signal="SIGINT")))
    assert code == 130, err[-3000:]
    assert "stopped: SIGINT at step 3; checkpoint saved" in err
    assert (run / "stages" / "2_head" / "backbone.json").is_file()
    assert not (run / "stages" / "3_ct" / "backbone.json").exists() and not (run / "backbone.json").exists()
    caplog.set_level(logging.INFO, logger="selfsup")
    assert main(["pretrain", str(run)]) == 0
    assert "stage 1 (mae) is done" in caplog.text and "stage 2 (head) is done" in caplog.text
    a, b = _model(reference / "stages" / "3_ct"), _model(run / "stages" / "3_ct")
    assert all(torch.equal(a[k], b[k]) for k in a)
    ref, resumed = load_file(reference / "backbone.safetensors"), load_file(run / "backbone.safetensors")
    assert all(torch.equal(ref[k], resumed[k]) for k in ref)


def test_init_from_starts_a_stage_from_another_runs_weights(reference, tmp_path, config):
    text = config.read_text().replace("  - {name: mae}\n", "").replace(
        "  - name: head\n", f"  - name: head\n    init_from: {reference / 'stages' / '1_mae'}\n")
    path = tmp_path / "from_mae.yaml"
    path.write_text(text)
    run = tmp_path / "run"
    assert main(["pretrain", str(path), f"trainer.out={run}"]) == 0
    mae, head = _model(reference / "stages" / "1_mae"), _model(run / "stages" / "1_head")
    assert all(torch.equal(mae[k], head[k]) for k in mae if k.startswith("encoder."))
    assert torch.equal(load_file(run / "stages" / "1_head" / "backbone.safetensors")["blocks.0.attn.qkv.weight"],
                       mae["encoder.blocks.0.attn.qkv.weight"])


def test_a_damaged_init_from_checkpoint_stops_the_run_before_any_stage_trains(reference, tmp_path, config, capsys):
    source = tmp_path / "source"
    (source / "checkpoints").mkdir(parents=True)
    state = torch.load(reference / "stages" / "1_mae" / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    text = config.read_text().replace("  - name: ct\n", f"  - name: ct\n    init_from: {source}\n")
    path = tmp_path / "from_source.yaml"
    path.write_text(text)
    name = next(k for k in state["model"] if k.startswith("encoder."))
    damaged = {"non-finite": {**state, "model": {**state["model"], name: torch.full_like(state["model"][name], float("nan"))}},
               "missing model": {k: v for k, v in state.items() if k != "model"}}
    for case, expected in [("non-finite", f"non-finite values in model.{name}"), ("missing model", "key 'model'"),
                           ("unreadable", "cannot read checkpoint")]:
        ckpt = source / "checkpoints" / "last.pt"
        if case == "unreadable":
            ckpt.write_bytes(b"not a checkpoint")
        else:
            torch.save(damaged[case], ckpt)
        run = tmp_path / f"run_{case.replace(' ', '_')}"
        capsys.readouterr()
        assert main(["pretrain", str(path), f"trainer.out={run}"]) == 2, case
        err = capsys.readouterr().err
        assert expected in err and str(ckpt) in err and "point init_from at another finished run" in err, (case, err)
        assert not (run / "stages").exists() or not any((run / "stages").glob("*/checkpoints/last.pt")), case


def test_stage_config_errors_name_the_problem(tmp_path, config):
    cfg = load_config(config)
    assert [s.name for s in stage_configs(cfg)] == ["mae", "head", "ct"]
    assert stage_configs(cfg)[2].cfg.trainer.max_steps == 8 and stage_configs(cfg)[2].cfg.model.freeze == 1
    assert stage_configs(cfg)[0].cfg.trainer.out.endswith("stages/1_mae")
    for bad, message in [("stages: [{name: a}, {name: a}]", "unique name"),
                         ("stages: [{name: a, eval: {knn_k: 3}}]", "unknown key stages.0.eval"),
                         ("stages: [{name: a, trainer: {devices: 2}}]", "trainer.devices cannot change per stage"),
                         ("stages: [{name: a, optim: {lrr: 1}}]", "unknown config key 'optim.lrr'"),
                         ("stages: [{name: a, init_from: 3}]", "init_from")]:
        path = tmp_path / "bad.yaml"
        path.write_text(bad)
        with pytest.raises(ConfigError, match=message):
            stage_configs(load_config(path))
    from selfsup.launch import validate

    path.write_text("method: {name: nnclr, queue_size: 100}\ntrainer: {batch_size: 64}")
    with pytest.raises(ConfigError, match="method.queue_size: 100 is not a multiple of the global batch 64"):
        validate(load_config(path))  # before any data is read or step taken
    path.write_text("model: {backbone: resnet18, freeze: 1}\ndata: {dataset: digits}")
    from selfsup.launch import pretrain

    with pytest.raises(ConfigError, match="model.freeze=1 needs a ViT"):
        pretrain(load_config(path, [f"trainer.out={tmp_path / 'r'}", "trainer.max_steps=1"]))


@pytest.mark.multiprocess
def test_a_staged_run_on_two_gloo_processes(config, tmp_path):
    """MAE, a frozen-encoder stage and a partly frozen one under DDP (frozen parameters and EMA copies are not
    DDP parameters; the queue is pushed from both processes)."""
    run = tmp_path / "run"
    code, err = finish(cli(["pretrain", str(config), f"trainer.out={run}", "trainer.devices=2", "trainer.accelerator=cpu",
                            "trainer.strategy=ddp"]))
    assert code == 0, err[-3000:]
    assert "cpu x2" in err and (run / "backbone.safetensors").is_file()
    mae, ct = _model(run / "stages" / "1_mae"), _model(run / "stages" / "3_ct")
    assert torch.equal(mae["encoder.blocks.0.attn.qkv.weight"], ct["encoder.blocks.0.attn.qkv.weight"])


def test_bench_measures_every_stage(config, capsys):
    assert main(["bench", str(config), "--steps", "1", "--warmup", "0"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(s["stage"], s["method"], s["views"]) for s in result["stages"]] == [("mae", "mae", 1), ("head", "nnclr", 2),
                                                                                  ("ct", "nnclr", 2)]
    assert all(s["train_images_per_s"] > 0 for s in result["stages"])


def _tiny_vit():
    from selfsup.models.vit import VisionTransformer

    return VisionTransformer(img_size=8, patch_size=4, in_channels=1, embed_dim=8, depth=2, num_heads=2, pool="mean")


def test_freeze_takes_0_to_depth_blocks_and_refuses_the_rest():
    from selfsup.methods.assemble import freeze

    stem_only, everything = _tiny_vit(), _tiny_vit()
    freeze(stem_only, 0)  # the stem alone
    assert not stem_only.patch_embed.weight.requires_grad and stem_only.blocks[0].norm1.weight.requires_grad
    freeze(everything, 2)  # every block
    assert not everything.blocks[1].norm1.weight.requires_grad and everything.norm.weight.requires_grad
    for bad in (-1, 3):
        with pytest.raises(ConfigError, match=rf"^bad value for model.freeze: {bad}; use a number of blocks in 0..2, "):
            freeze(_tiny_vit(), bad)


def test_method_names_are_checked_before_use():
    from selfsup.methods import method_config

    for spec, shown in (({}, "None"), ({"name": "simclr"}, "'simclr'"), ({"name": ["vicreg"]}, r"\['vicreg'\]")):
        with pytest.raises(ConfigError, match=rf"bad value for method.name: {shown}; allowed values: .*vicreg"):
            method_config(spec)


def test_carry_over_takes_a_backbone_or_encoder_and_restarts_the_ema_copies_from_it():
    from selfsup.methods.assemble import carry_over
    from selfsup.methods.byol import BYOL, BYOLConfig
    from selfsup.methods.nnclr import NNCLR, NNCLRConfig
    from selfsup.methods.vicreg import VICReg, VICRegConfig

    source = VICReg(_tiny_vit(), VICRegConfig(expander=[16, 16]), total_steps=4)  # keeps its encoder as `backbone.`
    byol = BYOL(_tiny_vit(), BYOLConfig(projector=[16, 8], predictor=[16, 8]), total_steps=4)
    carry_over(byol, source.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(byol.backbone.parameters(), source.backbone.parameters()))
    nnclr = NNCLR(_tiny_vit(), NNCLRConfig(projector=[16, 8], predictor=[16, 8], queue_size=16, encoder_momentum=0.99),
                  total_steps=4)
    carried = {f"encoder.{k}": v + 1.0 for k, v in nnclr.encoder.state_dict().items()}  # another run's encoder
    carry_over(nnclr, carried)
    assert all(torch.equal(p, carried[f"encoder.{k}"]) for k, p in nnclr.encoder_ema.module.state_dict().items())
    with pytest.raises(ConfigError, match="hold no encoder that this stage's method can take"):
        carry_over(nnclr, {"projector.0.weight": torch.zeros(16, 8)})
