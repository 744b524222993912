#!/bin/bash
# Device call: main's decode bench, then each patch set in VARIANTS (patch numbers, ';' between sets) with
# VTESTS (default: the monokernel GPU tests) and the decode bench. Sets are spread over the visible GPUs, one
# queue per GPU running in parallel. Logs as one tarball per set in $OUT; per-set summaries on stdout.
# Set names: main, v<patch numbers> (e.g. v06, v0608); EXTRA_<name> adds bench arguments for that set only.
# SAME_GPU=1: every set's bench on GPU 0, one after the other (machines and GPUs differ by ~1-2 %, so only benches
# on one GPU compare), and the sets' tests (BENCH=0) on GPU 1, or on GPU 0 after the benches when it is the only one.
set -o pipefail
ROOT=$(pwd)
FINAL=${OUT:-/tmp/mk_out}
mkdir -p "$FINAL"
BA=${BENCH_ARGS:-"--peer none --reps 3 --prefetch 0 --min-pos 128"}
NG=$(nvidia-smi -L | wc -l)
run() {  # name dir tests gpu [bench]; EXTRA_<name> (e.g. EXTRA_v06="--lookahead 262144") adds bench args for one set
  local extra="EXTRA_$1"
  CUDA_VISIBLE_DEVICES=$4 OUT=/tmp/out_$1 TESTS=$3 BENCH=${5:-1} BENCH_ARGS="$BA ${!extra}" \
    bash "$2/bench/device_run.sh" > "/tmp/sum_$1.txt" 2>&1
  tar czf "$FINAL/$1.tgz" -C /tmp "out_$1"
}
copy() {  # set -> its directory with the set's patches applied (prints it), or fails
  local d=/tmp/v$(echo "$1" | tr -d ' ')
  rm -rf "$d"; cp -r "$ROOT" "$d"
  (cd "$d" && for p in $1; do git apply "bench/experiments/$p"-*.patch || exit 1; done) && echo "$d" && return
  rm -rf "$d"; return 1
}
SETS=()
[ "${BASE:-1}" = 1 ] && SETS+=("main")
IFS=';' read -ra V <<< "${VARIANTS:-03;03 04}"
SETS+=("${V[@]}")
if [ "${SAME_GPU:-0}" = 1 ]; then
  for v in "${SETS[@]}"; do
    [ "$v" = main ] && continue
    d=$(copy "$v") || echo "patch failed" > "/tmp/sum_v$(echo "$v" | tr -d ' ').txt"
  done
  benches() {
    for v in "${SETS[@]}"; do
      if [ "$v" = main ]; then run main "$ROOT" none 0; continue; fi
      name=v$(echo "$v" | tr -d ' ')
      [ -d "/tmp/$name" ] && run "$name" "/tmp/$name" none 0 && mv "/tmp/sum_$name.txt" "/tmp/sum_${name}_bench.txt"
    done
  }
  tests() {
    for v in "${SETS[@]}"; do
      [ "$v" = main ] && continue
      name=v$(echo "$v" | tr -d ' ')
      [ -d "/tmp/$name" ] && run "${name}_t" "/tmp/$name" "${VTESTS:-tests/gpu/test_monokernel.py}" "$1" 0
    done
  }
  if [ "$NG" -gt 1 ]; then benches & tests 1 & wait; else benches; tests 0; fi
  for f in /tmp/sum_*.txt; do echo "=== $(basename "$f" .txt)"; grep -vE "^PASSED" "$f"; done
  exit 0
fi
for g in $(seq 0 $((NG - 1))); do
  (
    for i in "${!SETS[@]}"; do
      [ $((i % NG)) = "$g" ] || continue
      v=${SETS[$i]}
      if [ "$v" = main ]; then run main "$ROOT" none "$g"; continue; fi
      name=v$(echo "$v" | tr -d ' ')
      d=$(copy "$v") || { echo "patch failed" > "/tmp/sum_$name.txt"; continue; }
      run "$name" "$d" "${VTESTS:-tests/gpu/test_monokernel.py}" "$g"
    done
  ) &
done
wait
for v in "${SETS[@]}"; do
  name=$v; [ "$v" = main ] || name=v$(echo "$v" | tr -d ' ')
  echo "=== $name"; grep -vE "^PASSED" "/tmp/sum_$name.txt"
done
