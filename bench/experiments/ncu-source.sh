#!/bin/bash
# Warp-state sampling per SASS instruction and CUDA source line of one 64-token monokernel launch (Nsight Compute on
# the device; the library is built with -lineinfo), exported as CSV for bench/experiments/ncu-lines.py, which runs
# anywhere. Session 24 found the attention's integer divisions this way (bench/NOTES.md).
#   OUT=<dir> bash bench/experiments/ncu-source.sh qwen2.5-coder-0.5b[,qwen2.5-coder-1.5b]
#   -> $OUT/ncu_<shape>.csv (source + SASS, with samples and stall reasons), $OUT/ncu_<shape>_details.txt
# --clock-control none leaves the clocks as they are (the device's README); ~40-70 s per shape.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/ncu_out}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
for s in ${1//,/ }; do
  rep="$OUT/ncu_$s"
  (cd "$ROOT" && ncu --clock-control none --kernel-name mk_decode --launch-skip 1 --launch-count 1 --import-source yes \
    --section WarpStateStats --section SourceCounters -o "$rep" -f python3 bench/experiments/ncu-launch.py "$s" \
    > "$OUT/ncu_${s}_run.log" 2>&1) || { echo "ncu failed for $s (see $OUT/ncu_${s}_run.log)"; continue; }
  ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass > "$OUT/ncu_$s.csv"
  ncu -i "$rep.ncu-rep" --page details > "$OUT/ncu_${s}_details.txt"
  rm -f "$rep.ncu-rep"
  echo "$s: $OUT/ncu_$s.csv"
done
