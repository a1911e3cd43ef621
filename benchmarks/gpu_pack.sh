#!/usr/bin/env bash
# What benchmarks/gpu_check.sh needs on a lent GPU machine that cannot reach a package registry, packed here into
# .gpu_carry/ (ignored by git; carry it to the machine beside the working tree):
#
#   bash benchmarks/gpu_pack.sh MSN_GIT MAE_GIT
#
# MSN_GIT and MAE_GIT are git directories (or checkouts) of the public facebookresearch/msn and facebookresearch/mae
# repositories. Their HEAD is unpacked with `git archive` into .gpu_carry/authors/{msn,mae}, outside every tracked
# file: benchmarks/anchors_cuda.py imports the authors' modules from there at run time, and nothing of their code
# enters the project. .gpu_carry/authors/commits.txt records the two commits.
#
# .gpu_carry/wheels/ gets the wheels of the project's dependencies that a GPU image may lack (the versions of this
# machine's environment, so the GPU runs the code the tests ran): Lightning, lightning-utilities, torchmetrics,
# kornia and kornia-rs (a compiled wheel, fetched for CPython 3.12 on x86-64 Linux, the lent machines' Python), and
# a modern timm for MAE's models_mae.py. gpu_check.sh installs only those whose package the machine does not
# already have. The rest of pyproject.toml's dependencies (numpy, scipy, scikit-learn, matplotlib, pillow, pyyaml,
# safetensors, rich) are compiled or large, and the lent machines' image has them (its package list, 2026-11).
# Prints the folder's size: the device tool carries at most 64 MiB with the working tree.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: bash benchmarks/gpu_pack.sh MSN_GIT MAE_GIT" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$REPO/.gpu_carry
PY=${PYTHON:-python3}
TIMM_VERSION=${TIMM_VERSION:-1.0.31}  # imports on torch 2.2-2.13; its Block lacks qk_scale (anchors_cuda.py adapts)

git_dir() {  # a checkout's .git, or the git directory itself
  if [ -d "$1/.git" ]; then echo "$1/.git"; elif git --git-dir="$1" rev-parse --git-dir > /dev/null 2>&1; then echo "$1"
  else echo "not a git directory or checkout: $1" >&2; exit 2; fi
}

rm -rf "$CARRY/authors"
mkdir -p "$CARRY/authors/msn" "$CARRY/authors/mae" "$CARRY/wheels"
: > "$CARRY/authors/commits.txt"
for pair in "msn:$1" "mae:$2"; do
  name=${pair%%:*} dir=$(git_dir "${pair#*:}")
  git --git-dir="$dir" archive HEAD | tar -x -C "$CARRY/authors/$name"
  echo "$name $(git --git-dir="$dir" rev-parse HEAD)" >> "$CARRY/authors/commits.txt"
done
[ -f "$CARRY/authors/msn/src/msn_train.py" ] || { echo "$1 is not facebookresearch/msn (no src/msn_train.py)" >&2; exit 2; }
[ -f "$CARRY/authors/mae/models_mae.py" ] || { echo "$2 is not facebookresearch/mae (no models_mae.py)" >&2; exit 2; }

version() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
rm -f "$CARRY"/wheels/*.whl
pure=()
for dist in lightning lightning-utilities torchmetrics kornia; do pure+=("$dist==$(version "$dist")"); done
"$PY" -m pip download -q --no-deps -d "$CARRY/wheels" "${pure[@]}" "timm==$TIMM_VERSION"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$CARRY/wheels" "kornia_rs==$(version kornia_rs)"
ls -1 "$CARRY/wheels"
cat "$CARRY/authors/commits.txt"
echo "$(du -sh "$CARRY" | cut -f1) in $CARRY (the device tool carries 64 MiB with the working tree)"
