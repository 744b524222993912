#!/bin/bash
# A/B of one patch against main on one GPU, one Monokernel per process (bench/experiments/one-launch-time.py),
# alternating main / patched twice per shape, then the patched tree's monokernel GPU tests. Logs in $OUT.
#   bash bench/experiments/ab.sh 69 qwen2.5-coder-0.5b,llama-3.2-1b,qwen2.5-coder-1.5b [extra one-launch-time args]
# ALT=".signal_warp=0" adds a third run per round: the patched tree with those one-launch-time args (the patch's
# run-time switch off: its mechanism apart from what its code costs); ALT2 a fourth. TESTS=none skips the GPU tests;
# TESTS="-k 'expr with spaces'" picks some (the value is parsed as shell words: quote an expression inside it). Ends with a table of each variant's mean us/token per shape and context.
# Sessions 16-17 found that code that never runs moves this kernel by 2-6 % (through how the change compiles, not
# where its code sits: pad-sweep.sh): compare a kernel change this way, with a run-time switch where it has one.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 KOG_KERNELS_CACHE=${KOG_KERNELS_CACHE:-/tmp/kcache}
OUT=${OUT:-/tmp/ab_out}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
P=$1; SHAPES=${2:-qwen2.5-coder-0.5b}; shift; [ $# -gt 0 ] && shift
B=/tmp/ab_patched_$P
# The patched tree is a copy of the working tree as it is (as variants.sh makes its sets), not a worktree of HEAD:
# on the device machine HEAD is the session's first commit with the rest uncommitted on top.
rm -rf "$B"; cp -r "$ROOT" "$B" || exit 1
(cd "$B" && git apply "$ROOT"/bench/experiments/"$P"-*.patch) || { echo "patch $P does not apply"; exit 1; }
(cd "$ROOT" && python3 -m kernels.build > "$OUT/build_main.log" 2>&1) &
(cd "$B" && python3 -m kernels.build > "$OUT/build_$P.log" 2>&1); wait
grep -h "spill" "$OUT/build_$P.log" | sort | uniq -c
for s in ${SHAPES//,/ }; do
  for r in 1 2; do
    for t in main "$P" ${ALT:+alt} ${ALT2:+alt2}; do
      d=$ROOT; [ "$t" = main ] || d=$B
      extra=(); [ "$t" = alt ] && extra=($ALT); [ "$t" = alt2 ] && extra=($ALT2)
      (cd "$d" && timeout 120 python3 bench/experiments/one-launch-time.py "$s" "$@" "${extra[@]}" \
        > "$OUT/${s}_${t}_$r.log" 2>&1)
      grep "us/token" "$OUT/${s}_${t}_$r.log" | sed "s/^/$t: /"
    done
  done
done
if [ "${TESTS:-}" != none ]; then
  (cd "$B" && eval timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -s -p no:cacheprovider \
    tests/gpu/test_monokernel.py "${TESTS:-}" > "$OUT/tests_$P.log" 2>&1); echo "tests rc $?"; tail -2 "$OUT/tests_$P.log"
fi
echo "variant shape ctx mean-us/token (alt: $ALT; alt2: $ALT2)"
bash "$ROOT"/bench/experiments/mean-table.sh "$OUT"
rm -rf "$B"
