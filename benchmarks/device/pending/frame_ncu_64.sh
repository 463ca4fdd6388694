#!/usr/bin/env bash
# Nsight Compute over every kernel of the fast 64-stream frame (`frame_ncu.py`, each kernel alone, caches
# flushed): which of its ~820 kernels take the ~4.16 ms of a replay (run 173), and how far their sum falls short
# of it (the chain's cost), now that the profiler's per-kernel times include each kernel's dependent-launch
# wait. Makes the snapshot where run_all.sh has not. ~450 s on a fresh machine. Figures: ncu/ncu-fast-b64.txt
# (and the .csv.gz).
. benchmarks/device/pending/trees.sh
if [ ! -d /tmp/q3tts/full ]; then
  PHASES="setup build snapshot" BUDGET_S=250 MAX_JOBS=16 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 | tail -4
fi
export QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache
echo "=== ncu ($(left)s left)"
PYTHONPATH=$PWD:/tmp/site_common timeout $(( $(left) - 20 )) python3 benchmarks/device/frame_ncu.py \
  --model /tmp/q3tts/full --out "$OUT/ncu" --modes fast --streams 64 --kernels 900 --timeout $(( $(left) - 30 )) 2>&1 | tail -60
gzip -f "$OUT"/ncu/*.csv 2>/dev/null
