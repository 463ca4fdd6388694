#!/usr/bin/env bash
# Fast mode's talker KV cache in e4m3 (`Mode.kv_cache_fp8`, `kv-cache-fp8.patch`; NOTES, fiftieth session) against
# the checkout: tree kvfp8's kernel device tests (the e4m3 cache's among them) and graph parity, then frame_time.py
# for the checkout and kvfp8 (ROUNDS, default 2, interleaved). ~450 s on a fresh machine.
. benchmarks/device/pending/trees.sh
PHASES="setup" BUDGET_S=60 bash benchmarks/device/run_all.sh 2>&1 | tail -2
make_tree kvfp8 kv-cache-fp8.patch
PHASES="snapshot build" BUDGET_S=150 bash benchmarks/device/run_all.sh 2>&1 | grep -E "rc=|===" | tail -6
wait
echo "=== ab ($(left)s left)"
QWEN3_TTS_REPORT_DIR=/tmp/q3tts/results/ab/kvfp8-reports TREES=kvfp8 TEST_TREES=kvfp8 PARITY_TREES=kvfp8 ROUNDS=${ROUNDS:-2} RUNS=3 BUDGET_S=$(( $(left) - 15 )) \
  bash benchmarks/device/ab_trees.sh 2>&1 | grep -v "^\s*$" | tail -70
tar czf "$OUT/ab.tgz" -C /tmp/q3tts/results ab
