#!/usr/bin/env bash
# The e4m3 KV cache's codes loaded and converted two at a time in the decode attention (`attention-code-pairs.patch`:
# kv_cache.cuh's `load_cache_row`, 16-bit loads and one conversion a pair; the bf16 kernels' SASS unchanged, the
# fp8 talker kernel's static instructions 3024 -> 2632) against the checkout: tree pairs's kernel device tests,
# then frame_time.py for the checkout and pairs (ROUNDS, default 2, interleaved). ~420 s on a fresh machine.
. benchmarks/device/pending/trees.sh
PHASES="setup" BUDGET_S=60 bash benchmarks/device/run_all.sh 2>&1 | tail -2
make_tree pairs attention-code-pairs.patch
PHASES="snapshot build" BUDGET_S=150 bash benchmarks/device/run_all.sh 2>&1 | grep -E "rc=|===" | tail -6
wait
echo "=== ab ($(left)s left)"
TREES=pairs TEST_TREES=pairs ROUNDS=${ROUNDS:-2} RUNS=3 BUDGET_S=$(( $(left) - 15 )) \
  bash benchmarks/device/ab_trees.sh 2>&1 | grep -v "^\s*$" | tail -70
tar czf "$OUT/ab.tgz" -C /tmp/q3tts/results ab
