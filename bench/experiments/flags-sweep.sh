#!/bin/bash
# Compiler-flag sweep (session 17): every source change since session 15 moved this kernel by 2-6 % through how it
# compiles (register allocation and schedule at the 128-register cap), not through code position (pad-sweep.sh).
# So the ptxas / nvcc options are a knob too: each set of flags (KOG_NVCC_FLAGS, its own cached build,
# kernels/build.py) timed one process at a time (bench/experiments/one-launch-time.py), twice, alternating with
# the default flags. Sets are separated by ';'.
#   bash bench/experiments/flags-sweep.sh [shapes, default qwen2.5-coder-0.5b] [sets]
set -o pipefail
export PYTHONUNBUFFERED=1 KOG_KERNELS_CACHE=${KOG_KERNELS_CACHE:-/tmp/kcache}
cd "$(dirname "$0")/../.." || exit 1
SHAPES=${1:-qwen2.5-coder-0.5b}
# Only sets whose SASS differs from the default's are worth device time: -Xptxas -O2,
# --allow-expensive-optimizations=true and --extra-device-vectorization give the default's SASS exactly (session 17,
# cluster one-set build); these three do not.
SETS=${2:-"-Xptxas -O1;-Xptxas -dlcm=cg;-Xptxas --disable-optimizer-constants"}
IFS=';' read -r -a sets <<< "$SETS"
for s in ${SHAPES//,/ }; do
  for r in 1 2; do
    for f in "" "${sets[@]}"; do
      KOG_NVCC_FLAGS="$f" timeout 200 python3 bench/experiments/one-launch-time.py "$s" 2>&1 | \
        grep -E "us/token|layer critical|nvcc failed|Error" | sed "s/^/[${f:-default}] /"
    done
  done
done
