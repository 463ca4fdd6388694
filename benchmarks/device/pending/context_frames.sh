#!/usr/bin/env bash
# The checkout's whole kernel device suite (run_all.sh's tests phase: the e4m3 cache landed after only
# ab_trees.sh's kernel-parity and sampling suites ran on it, run 179), then fast mode's e4m3 talker KV cache
# against bf16 as the context grows (`context_frames.py`, one process, two alternating rounds): the 64-row
# frame's replay after 1, 400 and 1200 frames. ~300 s on a fresh machine. Figures: run_all.log (tests),
# context-frames.json.
. benchmarks/device/pending/trees.sh
PHASES="setup build snapshot tests" BUDGET_S=230 MAX_JOBS=16 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 \
  | grep -E "rc=|passed|failed|error" | tail -8
export QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache
echo "=== context frames ($(left)s left)"
PYTHONPATH=$PWD:/tmp/site_common timeout $(( $(left) - 10 )) python3 benchmarks/device/context_frames.py \
  --model /tmp/q3tts/full --out "$OUT" 2>&1 | tail -40
