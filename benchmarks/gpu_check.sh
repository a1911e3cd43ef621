#!/usr/bin/env bash
# Issue 53's GPU measurements in one command, in under 10 minutes on one H100 or H200: selfsup's training step at
# 224 px for MSN ViT-S/16, MAE ViT-B/16 and MAST-5 ResNet-50 in bf16-mixed and fp32 (images/s, FLOPs, TFLOP/s, MFU,
# peak memory), the streaming loader against MSN's step, the authors' MSN and MAE steps beside selfsup's, and the
# CUDA tests.
#
#   bash benchmarks/gpu_check.sh OUT_DIR
#   GPU_CHECK_DRY=1 PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh OUT_DIR   # every step on the CPU, tiny
#
# Before it, where a package registry and the authors' repositories are at hand: `bash benchmarks/gpu_pack.sh
# MSN_GIT MAE_GIT` fills .gpu_carry/ (ignored by git), which must travel with the working tree. Nothing is fetched
# here: the carried wheels whose package this machine lacks are installed into a folder of their own
# ($SCRATCH/site), put on PYTHONPATH behind the repository, so the working tree's selfsup is the one that runs.
# Writes OUT_DIR/env.txt (GPU, driver, versions), OUT_DIR/<step>.log, OUT_DIR/steps.log (a step a line: exit status,
# wall time, the log's last line), OUT_DIR/bench.jsonl (a `selfsup bench` result a line, with its step name and
# config) and OUT_DIR/sbs.jsonl (benchmarks/anchors_cuda.py's lines); then `python benchmarks/gpu_table.py OUT_DIR`
# prints the tables. A failing step does not stop the others. Each has its own timeout and none runs past the
# budget (GPU_CHECK_BUDGET seconds from the start, default 570): a step is cut to the time left, and skipped with a
# note in steps.log when under 20 s are left.
#
# Time plan on an H100. The FLOPs of a step (forward and backward, `selfsup bench`'s count) per image: MSN ViT-S/16
# 81 (1 target + 1 masked anchor at 224 px, 10 focal views at 96), MAE ViT-B/16 59, MAST-5 ResNet-50 99 (two 224 px
# views, the 8192-wide trunk on the 7x7 map). At ~300 TFLOP/s in bf16 a step of the batches below takes 35-50 ms; in
# fp32 (TF32 matmuls, trainer.tf32's default; ~40 TFLOP/s if it is turned off) up to 260-380 ms. So 24 steps take 1-9 s, and a bench's ~25 s are
# mostly start-up (imports, CUDA context, building the model, counting FLOPs):
#   install + env 15 s | bench bf16 x3 75 s | side by side bf16 (5 steps built, 20 s each) 100 s | loader 60 s |
#   bench fp32 x3 100 s | CUDA + FLOP tests <= 120 s | SDPA / compile tests <= 60 s | compiled MSN (once
#   trainer.compile exists) ~120 s | sync debug 60 s | side by side fp32 ~100 s: ~810 s if all ran, so the budget decides how far the
#   last steps get. The goals' measurements come first, the tests after them, the fp32 side by side ("if time
#   allows") last.
# Batches, by memory: what a step keeps for its backward is ~16 floats per token per block (attention through
# SDPA keeps no N x N matrix). MSN trains on 167 + 10 x 37 = 537 tokens of ViT-S per image: 12 x 537 x 16 x 384 x
# 4 B ~ 160 MB an image in fp32, 20 GB at 128 (half in bf16); MAE ViT-B: 50 encoder tokens + 197 decoder tokens of
# 512 wide ~ 80 MB an image, 20 GB at 256; ResNet-50 ~ 90 MB per 224 px view, 2 views, 23 GB at 128. All fit in the
# H100's 80 GB with room for the optimiser state and the allocator, and each fills the GPU (10-15 TFLOP a step).
# The side by side runs at 64, the authors' batch per GPU in both recipes.
set -u
[ $# -eq 1 ] || { echo "usage: bash benchmarks/gpu_check.sh OUT_DIR" >&2; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3}
DRY=${GPU_CHECK_DRY:-0}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/selfsup_gpu_check.XXXX")
S=$(date +%s)
DEADLINE=$(( S + ${GPU_CHECK_BUDGET:-$([ "$DRY" = 1 ] && echo 1800 || echo 570)} ))
SLOW=$([ "$DRY" = 1 ] && echo 3 || echo 1)  # the dry run's timeouts: a 2-core CPU in bf16 is slow even at 64 px
: > "$OUT/bench.jsonl"
: > "$OUT/sbs.jsonl"
: > "$OUT/steps.log"

note() { echo "[$(( $(date +%s) - S ))s] $*" | tee -a "$OUT/steps.log"; }
RC=""
run() {  # run NAME TIMEOUT_S COMMAND...: cut to the budget's time left, skipped under 20 s; RC says how it ended
  local name=$1 lim=$(( $2 * SLOW )) t0 left; shift 2; t0=$(date +%s); left=$(( DEADLINE - t0 ))
  rm -f "$OUT/$name.log"
  if [ "$left" -lt 20 ]; then RC="skipped: ${left} s of the budget left"; note "$name $RC"; return 0; fi
  [ "$lim" -gt "$left" ] && lim=$left
  timeout "$lim" "$@" > "$OUT/$name.log" 2>&1; RC=$?
  [ "$RC" = 124 ] && RC="124 (timed out after $lim s)"
  note "$name rc=$RC wall=$(( $(date +%s) - t0 ))s :: $(tail -1 "$OUT/$name.log" | cut -c1-400)"
  return 0
}

# The carried wheels whose package is missing here, into their own folder (pip --target: nothing else changes).
SITE=$SCRATCH/site
missing=()
for whl in "$REPO"/.gpu_carry/wheels/*.whl; do
  [ -e "$whl" ] || { note "no .gpu_carry/wheels: run benchmarks/gpu_pack.sh where a registry is at hand"; break; }
  dist=$(basename "$whl" | cut -d- -f1)
  "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2> /dev/null || missing+=("$whl")
done
if [ ${#missing[@]} -gt 0 ]; then
  run install 120 "$PY" -m pip install --no-index --no-deps --no-compile --target "$SITE" "${missing[@]}"
fi
export PYTHONPATH=$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
SELFSUP=("$PY" -m selfsup.cli)

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null \
    || echo "no GPU (nvidia-smi)"
  lscpu 2> /dev/null | grep 'Model name'; echo "cores $(nproc)"
  "$PY" - <<'EOF'
import importlib.metadata as m, importlib.util, platform, torch, selfsup
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", gpu)
print(", ".join(f"{d} {m.version(d) if importlib.util.find_spec(d) else 'absent'}"
                for d in ("lightning", "kornia", "timm", "torchvision")))
print("selfsup from", selfsup.__file__)
EOF
  echo "installed from .gpu_carry/wheels: ${missing[*]:-none}"
  echo "commit $(git -C "$REPO" rev-parse HEAD 2> /dev/null || echo unknown)"; } > "$OUT/env.txt" 2>&1
[ "$DRY" = 1 ] && echo "dry run (GPU_CHECK_DRY=1): CPU, tiny sizes; not a benchmark" >> "$OUT/env.txt"

# Sizes: the real ones, or the dry run's (64 px, batch 2, one step) that only test this script.
declare -A BATCH=([msn_vit_s16]=128 [mae_vit_b16]=256 [mast5_resnet50]=128)
declare -A SMALL=([msn_vit_s16]="data.image_size=64 views.2.size=32" [mae_vit_b16]="data.image_size=64"
                  [mast5_resnet50]="data.image_size=64 views.0.size=64 method.trunk=[256,256]
                                    method.embedding_dim=128")
STEPS=(--steps 20 --warmup 3); SBS=(--steps 20 --warmup 3 --batch 64); DEV=()
PHOTOS=3000; WORKERS=$(( $(nproc) - 2 ))  # loader workers: the cores less the trainer's and the main process's
if [ "$DRY" = 1 ]; then
  for k in "${!BATCH[@]}"; do BATCH[$k]=2; done
  STEPS=(--steps 1 --warmup 1); SBS=(--steps 1 --warmup 0 --batch 2 --device cpu --image-size 32)
  DEV=(trainer.accelerator=cpu); PHOTOS=40; WORKERS=1
fi
[ "$WORKERS" -lt 1 ] && WORKERS=1

bench() {  # bench NAME CONFIG PRECISION [more selfsup bench arguments...]: one line of bench.jsonl
  local name=$1 cfg=$2 precision=$3 small=(); shift 3
  [ "$DRY" = 1 ] && read -r -d '' -a small <<< "${SMALL[$cfg]}"  # all its words, no globs: [256,256] as written
  run "$name" "${BENCH_TIMEOUT:-90}" "${SELFSUP[@]}" bench "configs/imagenet/$cfg.yaml" trainer.precision="$precision" \
      trainer.batch_size="${BATCH[$cfg]}" "${DEV[@]}" "${small[@]}" "${STEPS[@]}" "$@"
  "$PY" - "$name" "$cfg" "$OUT/$name.log" "$RC" >> "$OUT/bench.jsonl" <<'EOF'
import json, os, sys
name, cfg, log, rc = sys.argv[1:]
text = open(log, errors="replace").read() if os.path.exists(log) else ""
try:
    result = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
except (IndexError, json.JSONDecodeError):
    result = {"error": f"rc {rc}: {text[-1500:]}" if text else f"rc {rc}"}
print(json.dumps({"name": name, "config": cfg, **result}))
EOF
}

# Does this selfsup know trainer.compile (another branch adds it)? A config check, no training.
COMPILE=0
if "$PY" -c "from selfsup.load import load_config
load_config('configs/imagenet/msn_vit_s16.yaml', ['trainer.compile=true'])" > "$OUT/compile_probe.log" 2>&1; then
  COMPILE=1; note "trainer.compile is known: one compiled MSN line"
else
  note "trainer.compile is unknown here: no compiled line ($(tail -1 "$OUT/compile_probe.log" | cut -c1-200))"
fi

# 1. The step at 224 px in bf16-mixed (the goals' precision), synthetic data: FLOPs, TFLOP/s, MFU, peak memory.
for cfg in msn_vit_s16 mae_vit_b16 mast5_resnet50; do bench "bench_${cfg}_bf16" "$cfg" bf16-mixed --synthetic; done
# 2. The authors' steps beside selfsup's, bf16-mixed (MAE also with a modern timm's fused attention).
run sbs_msn_bf16 240 "$PY" benchmarks/anchors_cuda.py --configs msn_vit_s16 --precisions bf16-mixed "${SBS[@]}" \
    --out "$OUT/sbs.jsonl"
run sbs_mae_bf16 240 "$PY" benchmarks/anchors_cuda.py --configs mae_vit_b16 --impls authors,authors-sdpa,selfsup \
    --precisions bf16-mixed "${SBS[@]}" --out "$OUT/sbs.jsonl"
# 3. The streaming loader at 224 px: photo-sized JPEGs (300-500 px a side, benchmarks/streaming.py's) on local disk,
#    decoded and cropped (1 + 1 + 10 views) by loader workers, against MSN's step on the crops they made.
run photos 120 "$PY" -c "import sys; from pathlib import Path; sys.path.insert(0, 'benchmarks'); import streaming
print(streaming.make_folder(Path(sys.argv[1]) / 'train', int(sys.argv[2])))" "$SCRATCH/photos" "$PHOTOS"
bench loader_msn_vit_s16_bf16 msn_vit_s16 bf16-mixed data.root="$SCRATCH/photos" data.stream=true \
    data.num_workers="$WORKERS"
# 4. fp32 (32-true): the other half of "bf16 faster than fp32".
for cfg in msn_vit_s16 mae_vit_b16 mast5_resnet50; do
  BENCH_TIMEOUT=120 bench "bench_${cfg}_fp32" "$cfg" 32-true --synthetic
done
# 5. The CUDA tests and the FLOP counts; then the SDPA and compile tests wherever they are (by name: pytest's exit 5
#    says there are none yet).
run pytest_cuda 120 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_flops.py
run pytest_sdpa_compile 60 "$PY" -m pytest -q -p no:cacheprovider tests -k "sdpa or compile"
# 6. With the time left: torch.compile on MSN (if this selfsup has it), then the side by side in fp32.
[ "$COMPILE" = 1 ] && BENCH_TIMEOUT=180 bench bench_msn_vit_s16_bf16_compile msn_vit_s16 bf16-mixed --synthetic \
    trainer.compile=true
# 7. Host-device synchronisations left inside the step: 30 steps of MSN on the photos with SELFSUP_SYNC_DEBUG=warn
#    (torch.cuda.set_sync_debug_mode in the steps that log and save nothing, selfsup/train/speed.py); sync_debug.log
#    holds a warning per synchronising place, their count on its last line.
small=(); [ "$DRY" = 1 ] && read -r -d '' -a small <<< "${SMALL[msn_vit_s16]}"
run sync_debug 120 env SELFSUP_SYNC_DEBUG=warn "${SELFSUP[@]}" pretrain configs/imagenet/msn_vit_s16.yaml \
    data.root="$SCRATCH/photos" data.stream=true data.num_workers="$WORKERS" trainer.precision=bf16-mixed \
    trainer.batch_size="$([ "$DRY" = 1 ] && echo 2 || echo 64)" trainer.max_steps=30 trainer.log_every_steps=10 \
    trainer.progress=false trainer.out="$SCRATCH/sync_debug" "${DEV[@]}" "${small[@]}"
[ -f "$OUT/sync_debug.log" ] && echo "synchronising places: $(grep -c 'called a synchronizing CUDA operation' \
    "$OUT/sync_debug.log")" | tee -a "$OUT/sync_debug.log" "$OUT/steps.log"
run sbs_fp32 240 "$PY" benchmarks/anchors_cuda.py --precisions 32-true "${SBS[@]}" --out "$OUT/sbs.jsonl"
note "done in $(( $(date +%s) - S ))s; tables: $PY benchmarks/gpu_table.py $OUT"
rm -rf "$SCRATCH"
