#!/usr/bin/env bash
# Session 46: the qkv product of 33-64 rows as one Triton kernel (no split, dependently launched; tree qkv1)
# against the checkout (cuBLAS qkv). Fresh machine: ~330 s; warm: ~160 s. Make the tree first: the tree recipe in
# ab_trees.sh's header from the head, into .whl/tree-qkv1, then `git apply --directory=.whl/tree-qkv1/qwen3_tts_native
# benchmarks/device/pending/qkv-one-kernel.patch` (its paths are engine/...).
S=$(date +%s)
left() { echo $(( ${TOTAL:-480} - ($(date +%s) - S) )); }
if [ ! -d /tmp/q3tts/full ]; then
  ( cd .whl/tree-qkv1 && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-qkv1 MAX_JOBS=6 PYTHONPATH=$PWD:/tmp/site_common \
      timeout 250 python3 -m qwen3_tts_native.engine.kernels build > /tmp/q3tts-build-qkv1.log 2>&1; echo "tree qkv1 build rc=$?" ) &
  PHASES="setup build snapshot" BUDGET_S=250 MAX_JOBS=10 COMMIT=s46 bash benchmarks/device/run_all.sh 2>&1 | tail -4
  wait
fi
echo "=== ab ($(left)s left)"
TREES="qkv1" TEST_TREES="" ROUNDS=2 BUDGET_S=$(( $(left) - 5 )) bash benchmarks/device/ab_trees.sh > /dev/null 2>&1
python3 - <<'PY'
import re, json
log = open(__import__("os").environ["OUT"] + "/ab_trees.log").read()
print("\n".join(l for l in log.splitlines() if l.startswith("===") or "rc=" in l))
for m in re.finditer(r"^(\w+\d) (exact|fast) (\{.*\})$", log, re.M):
    d = json.loads(m.group(3))
    keys = ("frame_replay_1_ms", "frame_replay_16_ms", "frame_replay_64_ms", "lockstep_64_aggregate_rtf", "lockstep_64_worst_stream_rtf")
    print(m.group(1), m.group(2), {k: round(d[k], 5) for k in keys if k in d})
PY
