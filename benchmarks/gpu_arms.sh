#!/usr/bin/env bash
# Step-matched trial arms trained side by side on one GPU: a screen for settings that the CPU then confirms.
#
#   CIFAR=DIR bash benchmarks/gpu_arms.sh ARMS_FILE OUT_DIR [PARALLEL]
#
# ARMS_FILE has one arm a line, shell words: NAME STEPS CONFIG [key=value ...]; '#' lines are skipped. Each arm is
# `benchmarks/accuracy_per_minute.py CONFIG --steps STEPS` with one evaluated snapshot (the end) on the held-out 10 %
# (20-NN, linear, low-shot, k-means; not raw pixels, the same for every arm), one CPU thread, `data.root=$CIFAR`,
# in the config's own precision (fp32 for every laptop preset), so an arm is the same experiment as a CPU run of as
# many steps, up to the device's rounding.
# PARALLEL arms run at once (default 8): a laptop preset's step leaves a large GPU mostly idle, so they share it.
# Twelve at once kept an H200 at 99 % (2026-11-26): ExtreMA's 3,043 steps took 335 s of training, its evaluation
# about 80 s more.
# ARM_TIMEOUT (seconds, default none) stops an arm that runs longer; its line then has rc 124 and no result.
# Writes OUT_DIR/NAME.log per arm and OUT_DIR/arms.jsonl, one line per arm: its name, exit status, wall seconds and
# the script's JSON result. The step counts to use are the CPU runs' (docs/benchmarks.md): a GPU arm says nothing
# about CPU time, only about accuracy at a given number of steps.
set -u
[ $# -ge 2 ] || { echo "usage: CIFAR=DIR bash benchmarks/gpu_arms.sh ARMS_FILE OUT_DIR [PARALLEL]" >&2; exit 2; }
ARMS=$1 OUT=$2 PAR=${3:-8}
: "${CIFAR:?set CIFAR to the CIFAR-10 image folder (CIFAR/train/<class>/*.jpg)}"
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
arm() {  # arm NAME STEPS CONFIG [overrides...]
  local name=$1 steps=$2 cfg=$3 t0=$(date +%s) rc; shift 3
  timeout "${ARM_TIMEOUT:-0}" "$PY" "$HERE/benchmarks/accuracy_per_minute.py" "$cfg" data.root="$CIFAR" trainer.num_threads=1 "$@" \
      --steps "$steps" --points 1 --evals knn,linear,lowshot,cluster --holdout 0.1 --no-raw --out "$OUT/runs/$name" \
      > "$OUT/$name.log" 2>&1
  rc=$?
  "$PY" - "$name" "$rc" "$(( $(date +%s) - t0 ))" "$OUT/$name.log" >> "$OUT/arms.jsonl" <<'EOF'
import json, sys
name, rc, wall, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lines = [l for l in open(log, errors="replace").read().splitlines() if l.startswith("{")]
try:
    result = json.loads(lines[-1]) if lines else None
except json.JSONDecodeError:
    result = None
print(json.dumps({"arm": name, "rc": rc, "wall_s": wall, "result": result}))
EOF
}
while read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  eval "set -- $line"
  while [ "$(jobs -rp | wc -l)" -ge "$PAR" ]; do sleep 2; done
  arm "$@" &
done < "$ARMS"
wait
