#!/usr/bin/env bash
# The decode attention with fewer instructions (`attention-instructions.patch`) against the checkout: an e4m3
# cache's codes loaded and converted two at a time (kv_cache.cuh's `load_cache_row`: 16-bit loads, one conversion
# a pair), and the warps past a row's length taking the empty partial at once (`empty_partial`) instead of the
# whole chain on no keys. Same values bit for bit. Tree attn's kernel device tests, then frame_time.py for the
# checkout and attn (ROUNDS, default 2, interleaved). ~420 s on a fresh machine.
. benchmarks/device/pending/trees.sh
PHASES="setup" BUDGET_S=60 bash benchmarks/device/run_all.sh 2>&1 | tail -2
make_tree attn attention-instructions.patch
PHASES="snapshot build" BUDGET_S=150 bash benchmarks/device/run_all.sh 2>&1 | grep -E "rc=|===" | tail -6
wait
echo "=== ab ($(left)s left)"
TREES=attn TEST_TREES=attn ROUNDS=${ROUNDS:-2} RUNS=3 BUDGET_S=$(( $(left) - 15 )) \
  bash benchmarks/device/ab_trees.sh 2>&1 | grep -v "^\s*$" | tail -70
tar czf "$OUT/ab.tgz" -C /tmp/q3tts/results ab
