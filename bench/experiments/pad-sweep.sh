#!/bin/bash
# Code-layout sweep (session 17): with 72-mk-pad-after-wait.patch applied, kernels/csrc/mk_pad.h sets MK_PAD, the
# number of never-executed shared-memory stores placed right after each instruction's wait; every op's code after
# it moves by ~32 * MK_PAD bytes, nothing else changes (MK_PAD 0 gives main's SASS exactly). One process per value
# (bench/experiments/one-launch-time.py: us/token at ctx 512 and 2048, twice, and the traced layer).
#   bash bench/experiments/pad-sweep.sh [shape, default qwen2.5-coder-0.5b] [pads, default 0,32,128,512]
set -o pipefail
export PYTHONUNBUFFERED=1 KOG_KERNELS_CACHE=${KOG_KERNELS_CACHE:-/tmp/kcache}
cd "$(dirname "$0")/../.." || exit 1
H=kernels/csrc/mk_pad.h
[ -f "$H" ] || { echo "apply bench/experiments/72-mk-pad-after-wait.patch first"; exit 1; }
SHAPE=${1:-qwen2.5-coder-0.5b}
PADS=${2:-0,32,128,512}
for n in ${PADS//,/ }; do
  sed -i "s/^#define MK_PAD .*/#define MK_PAD $n/" "$H"
  timeout 150 python3 bench/experiments/one-launch-time.py "$SHAPE" 2>&1 | grep -E "us/token|layer critical" | \
    sed "s/^/pad $n: /"
done
sed -i "s/^#define MK_PAD .*/#define MK_PAD 0/" "$H"
