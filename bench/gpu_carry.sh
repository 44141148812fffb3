#!/usr/bin/env bash
# What a GPU machine with Python 3.12 and torch, but neither Flower nor network access, needs to run a sweep, made
# here and kept out of git: the wheels of what this project imports beyond torch, numpy, scipy and grpcio (Flower and
# its crypto, the DP accountant) in .gpu/whl, and the sweep's data export in parts (.gpu/part-00, -01, ...) that each
# fit an upload of 64 MiB beside the working tree (the last one beside the wheels too; PART_BYTES=N for another
# size). Prints the command to run there (bench/gpu_sweep.py); nothing here needs the GPU.
#   PFL_DATA_DIR=../shared/data bash bench/gpu_carry.sh bench/sweeps/paper_cifar.toml [--experiments 'cifar-ditto']
set -euo pipefail
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: bash bench/gpu_carry.sh SWEEP.toml [pflower export options]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
sweep=$(realpath --relative-to="$root" "$1"); shift  # as the command run from the tree's root there names it
cd "$root"
gitdir=$(git rev-parse --git-dir 2>/dev/null) \
  || { echo "bench/gpu_carry.sh: run it in a git checkout of the project (it counts the tree it uploads)" >&2; exit 2; }
mkdir -p "$gitdir/info" && { grep -qxF '/.gpu/' "$gitdir/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$gitdir/info/exclude"; }
rm -rf .gpu && mkdir -p .gpu/whl
# The machine's python3 is 3.12 and holds torch, numpy, scipy, grpcio, protobuf and matplotlib already.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl \
  flwr==1.42.0 cryptography cffi pycparser pycryptodome iterators grpcio-health-checking dill dp-accounting dm-tree
python3 -m experiments.cli export "$sweep" --webp --out .gpu/data.npz "$@"
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
wheels=$(du -sb .gpu/whl | cut -f1)
limit=$((64 * 1024 * 1024 - 2 * 1024 * 1024 - tree))  # 2 MiB spare for what the tree gains meanwhile
size=$(stat -c %s .gpu/data.npz)
# Every part fits a call with the tree; the last one also carries the wheels.
part=${PART_BYTES:-$((limit - wheels))}
n=$(((size + part - 1) / part))
for ((k = 0; k < n; k++)); do
  mkdir -p ".gpu/part-$(printf %02d "$k")"
  dd if=.gpu/data.npz of=".gpu/part-$(printf %02d "$k")/data" bs=1M iflag=skip_bytes,count_bytes \
    skip=$((k * part)) count=$part status=none
done
sha=$(sha256sum .gpu/data.npz | cut -d' ' -f1)
rm .gpu/data.npz
echo "export: $size bytes in $n parts (sha256 $sha); wheels: $wheels bytes; tree: $tree bytes"
echo "upload the working tree with .gpu/whl and .gpu/part-* (one part an upload where uploads are limited to 64 MiB;"
echo "the last part with the wheels), then run from its root there (add --only '...' as the sweep needs):"
# A private folder of the session's own (mktemp -d: 0700, a random name), never a fixed path under /tmp that another
# local user could create first and fill with a module of theirs.
echo "  T=\$(mktemp -d) && python3 -m pip install -q --no-index --no-deps --no-compile --target \$T/site .gpu/whl/*.whl && export PYTHONPATH=\$T/site:\$PWD && cat .gpu/part-*/data > \$T/data.npz && echo \"$sha  \$T/data.npz\" | sha256sum -c - && PYTHONUNBUFFERED=1 python3 bench/gpu_sweep.py $sweep --shards 5 --workers 3 --deadline-s 500 --data-export \$T/data.npz --pack \$OUT"
echo "(OUT: a folder that comes back). Back here: python bench/gpu_unpack.py OUT --into results/NAME (NAME: the sweep's"
echo "name; it checks the parts against runs.sha256 before unpacking)."
echo "The same command again there resumes what the deadline stopped."
