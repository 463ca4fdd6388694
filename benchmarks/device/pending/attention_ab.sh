#!/usr/bin/env bash
# The decode attention's instructions cut two ways, against the checkout (~480 s on a fresh machine):
# - tree attn (`attention-instructions.patch`): an e4m3 cache's codes loaded and converted two at a time
#   (kv_cache.cuh's `load_cache_row`), and the warps past a row's length on `empty_partial` at once; the same
#   values bit for bit;
# - tree attnmma (that patch, then `attention-tensor-cores.patch`): the talker's and the predictor's attention on
#   tensor cores (`attend_warp_mma`: mma.m16n8k16; e4m3 codes as f16 with the queries and P' rounded to f16, a
#   bf16 cache with the queries and probabilities as bf16 high and low parts).
# Both trees' kernel device tests, attnmma's graph parity (its figures move in both modes), then frame_time.py for
# the checkout and both trees (ROUNDS, default 2, interleaved).
. benchmarks/device/pending/trees.sh
PHASES="setup" BUDGET_S=60 bash benchmarks/device/run_all.sh 2>&1 | tail -2
make_tree attn attention-instructions.patch
make_tree attnmma attention-instructions.patch attention-tensor-cores.patch
PHASES="snapshot build" BUDGET_S=150 bash benchmarks/device/run_all.sh 2>&1 | grep -E "rc=|===" | tail -6
wait
echo "=== ab ($(left)s left)"
QWEN3_TTS_REPORT_DIR=/tmp/q3tts/results/ab/attnmma-reports TREES="attn attnmma" TEST_TREES="attn attnmma" \
  PARITY_TREES=attnmma ROUNDS=${ROUNDS:-2} RUNS=3 BUDGET_S=$(( $(left) - 15 )) \
  bash benchmarks/device/ab_trees.sh 2>&1 | grep -v "^\s*$" | tail -90
tar czf "$OUT/ab.tgz" -C /tmp/q3tts/results ab
