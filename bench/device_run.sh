#!/bin/bash
# One device call for the single-GPU work: build, SASS sanity, smoke/bisect, every GPU test (tests/gpu), the decode
# bench (BENCH=0 skips it), and with EDITOR=1 the prefill bench (PREFILL=0 skips it) and the GPU editor loop. Logs in $OUT, a short
# summary on stdout.
#   TESTS="tests/gpu/test_monokernel.py" (or none) BENCH_ARGS="--peer none" TEST_TIMEOUT=300 BENCH_TIMEOUT=240 EDITOR=1 bash bench/device_run.sh
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 KOG_KERNELS_CACHE=/tmp/kcache
OUT=${OUT:-/tmp/mk_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
python3 -m kernels.build > "$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
grep -E "registers|spill|built" "$OUT/build.log"
LIB=$(python3 -c "from kernels.build import cache_root, source_hash; print(cache_root() / source_hash(head_dim=64) / 'libmonokernel.so')")
cuobjdump -sass "$LIB" > "$OUT/sass.txt" 2>&1 && \
  echo "SASS: LDG.E.128 $(grep -c 'LDG.E.128' "$OUT/sass.txt")  local LDL/STL $(grep -cE 'LDL|STL' "$OUT/sass.txt")  bulk-prefetch $(grep -c 'UBLKPF' "$OUT/sass.txt")"
echo "build+sass $(( $(date +%s) - t0 )) s"
if ! timeout 90 python3 bench/mk_smoke.py > "$OUT/smoke.log" 2>&1; then
  cat "$OUT/smoke.log" | tail -30
  echo "smoke failed; again with early loads off:"
  timeout 60 python3 bench/mk_smoke.py --early 0 2>&1 | tail -12
  echo "compute-sanitizer on 8 CTAs"
  timeout 150 compute-sanitizer --tool memcheck --print-limit 10 python3 bench/mk_smoke.py --sms 8 --steps 2 --slow \
    > "$OUT/sanitizer.log" 2>&1
  tail -40 "$OUT/sanitizer.log"
  [ -z "$FORCE_ALL" ] && exit 1
fi
tail -12 "$OUT/smoke.log"
echo "smoke done at $(( $(date +%s) - t0 )) s"
if [ "${TESTS:-tests/gpu}" != none ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -s -rA -p no:cacheprovider ${TESTS:-tests/gpu} \
    ${TEST_ARGS} > "$OUT/tests.log" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|rel L2|cancel:|passed|failed|Error:|assert" "$OUT/tests.log" | head -40
  echo "tests done at $(( $(date +%s) - t0 )) s"
fi
if [ "${BENCH:-1}" != 0 ]; then
  timeout "${BENCH_TIMEOUT:-240}" python3 bench/decode.py ${BENCH_ARGS} > "$OUT/bench.log" 2>&1
  grep -E "skipped|Error|error" "$OUT/bench.log" | head -8
  tail -n 6 "$OUT/bench.log" | grep -v '^{'
  echo "decode bench done at $(( $(date +%s) - t0 )) s"
fi
if [ -n "$EDITOR" ]; then
  if [ "${PREFILL:-1}" != 0 ]; then
    timeout 120 python3 bench/prefill.py > "$OUT/prefill.log" 2>&1; tail -n 9 "$OUT/prefill.log" | grep -v '^{'
  fi
  timeout "${EDITOR_TIMEOUT:-240}" python3 bench/editor_loop.py --mode engine --device cuda \
    --random-shape qwen2.5-coder-1.5b --max-tokens 16 ${EDITOR_ARGS} > "$OUT/editor.log" 2>&1
  tail -n 8 "$OUT/editor.log" | grep -v '^{"kind"'
fi
echo "all done at $(( $(date +%s) - t0 )) s"
