#!/usr/bin/env bash
# The GPU path in one command: the CUDA tests, the quick-start and MSN's CIFAR-10 laptop preset trained on CUDA in
# bf16-mixed and evaluated there, the synchronisations left in MSN's step, and `selfsup bench` for the bench presets
# in fp32 and bf16-mixed at batch 64 and 256 (and MSN's compiled at 256).
#
#   bash benchmarks/gpu_check.sh FASHION_MNIST_DIR CIFAR10_DIR OUT_DIR
#
# FASHION_MNIST_DIR holds the IDX files (dataset-fashion-mnist's /usr/share/datasets/fashion-mnist); CIFAR10_DIR is
# the image folder (CIFAR10_DIR/train/<class>/*.jpg). Each step writes OUT_DIR/<step>.log; OUT_DIR/steps.log gets its
# exit status, wall time and last line (the JSON of eval and bench); OUT_DIR/bench.jsonl one bench result a line.
# A failing step does not stop the others. Results of 2026-11-25 on an H100: docs/benchmarks.md, "The GPU path".
set -u
[ $# -eq 3 ] || { echo "usage: bash benchmarks/gpu_check.sh FASHION_MNIST_DIR CIFAR10_DIR OUT_DIR" >&2; exit 2; }
FM=$1 CIFAR=$2 OUT=$3
mkdir -p "$OUT" /tmp/selfsup_gpu_check
RUNS=$(mktemp -d /tmp/selfsup_gpu_check/runs.XXXX)
PY=${PYTHON:-python3}
S=$(date +%s)
run() {  # run NAME TIMEOUT_S COMMAND...
  local name=$1 lim=$2 t0; shift 2; t0=$(date +%s)
  timeout "$lim" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "[$(( $(date +%s) - S ))s] $name rc=$rc wall=$(( $(date +%s) - t0 ))s :: $(tail -1 "$OUT/$name.log" | cut -c1-400)" \
    | tee -a "$OUT/steps.log"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; lscpu | grep 'Model name'
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } > "$OUT/env.txt" 2>&1
run pytest_cuda 600 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/data/test_views.py -k "cuda or device"
run quickstart_pretrain 900 selfsup pretrain configs/fashion_mnist/quickstart.yaml data.root="$FM" \
    trainer.precision=bf16-mixed trainer.out="$RUNS/quickstart"
run quickstart_eval 900 selfsup eval all "$RUNS/quickstart" --compare raw
run msn_pretrain 1800 selfsup pretrain configs/cifar10/laptop/msn.yaml data.root="$CIFAR" \
    trainer.precision=bf16-mixed trainer.out="$RUNS/msn"
run msn_eval 900 selfsup eval all "$RUNS/msn" --compare raw
# Host-device synchronisations left inside the step (issue 53): 30 steps of the MSN preset with SELFSUP_SYNC_DEBUG=warn
# (torch.cuda.set_sync_debug_mode in the steps that log and save nothing); sync_debug.log holds one warning per place
# that synchronises, and their count on its last line.
run sync_debug 600 env SELFSUP_SYNC_DEBUG=warn selfsup pretrain configs/cifar10/laptop/msn.yaml data.root="$CIFAR" \
    trainer.precision=bf16-mixed trainer.max_steps=30 trainer.log_every_steps=10 trainer.out="$RUNS/sync_debug"
echo "synchronising places: $(grep -c 'called a synchronizing CUDA operation' "$OUT/sync_debug.log")" \
    | tee -a "$OUT/sync_debug.log" "$OUT/steps.log"
for cfg in msn_vit_tiny_cifar extrema_vit_tiny_cifar; do for p in 32-true bf16-mixed; do for b in 64 256; do
  name=bench_${cfg%%_*}_${p}_b$b
  run "$name" 600 selfsup bench configs/bench/$cfg.yaml data.dataset=imagefolder data.root="$CIFAR" data.fraction=0.2 \
      trainer.precision=$p trainer.batch_size=$b --steps 30 --warmup 5
  tail -1 "$OUT/$name.log" >> "$OUT/bench.jsonl"
done; done; done
for p in 32-true bf16-mixed; do  # trainer.compile (its warm-up steps compile), beside the eager rows above
  name=bench_msn_compile_${p}_b256
  run "$name" 600 selfsup bench configs/bench/msn_vit_tiny_cifar.yaml data.dataset=imagefolder data.root="$CIFAR" \
      data.fraction=0.2 trainer.precision=$p trainer.batch_size=256 trainer.compile=true --steps 30 --warmup 5
  tail -1 "$OUT/$name.log" >> "$OUT/bench.jsonl"
done
