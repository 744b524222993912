#!/bin/bash
# One build, several run-time configurations: bench/experiments/one-launch-time.py once per (shape, configuration,
# round), alternating configurations within each round (two rounds), then a table of each configuration's mean
# us/token per shape and context. For schedule or attribute choices of the same library (no code change), so no
# main tree is needed; a configuration is one-launch-time's arguments, "-" for none.
#   bash bench/experiments/kw-sweep.sh qwen2.5-coder-0.5b,qwen2.5-coder-1.5b "-;mlp_weights=(1.0,0.9);mlp_weights=(1.05,0.95)"
# Logs in $OUT (default /tmp/kw_out).
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 KOG_KERNELS_CACHE=${KOG_KERNELS_CACHE:-/tmp/kcache}
OUT=${OUT:-/tmp/kw_out}; mkdir -p "$OUT"
cd "$(dirname "$0")/../.." || exit 1
python3 -m kernels.build > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
IFS=';' read -r -a CONFS <<< "$2"
for s in ${1//,/ }; do
  for r in 1 2; do
    for i in "${!CONFS[@]}"; do
      args=(); [ "${CONFS[$i]}" = "-" ] || read -r -a args <<< "${CONFS[$i]}"
      timeout 120 python3 bench/experiments/one-launch-time.py "$s" "${args[@]}" > "$OUT/${s}_c${i}_$r.log" 2>&1
      grep "us/token" "$OUT/${s}_c${i}_$r.log" | sed "s/^/c$i: /"
    done
  done
done
echo "configurations:"; for i in "${!CONFS[@]}"; do echo "  c$i: ${CONFS[$i]}"; done
echo "configuration shape ctx mean-us/token"
bash bench/experiments/mean-table.sh "$OUT"
