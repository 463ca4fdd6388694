#!/usr/bin/env bash
# Fast mode's products after an RMSNorm on e4m3 codes on both sides (`Mode.triton_fp8_rows`: the norm writes
# e4m3 rows, from the previous product's split sums too), against the checkout: tree fp8gu (`fp8-gate-up.patch`:
# the gate/up of 33-128 rows, `ops.triton_fp8_linear_swiglu`) and tree fp8all (that patch, then `fp8-qkv.patch`:
# the qkv too, `ops.triton_fp8_linear`). On a fresh machine the checkout's kernel device tests and graph
# parity first (rows128 and heads1 landed together after passing each in a tree of its own, runs 170-171). Then
# fp8all's product and norm device tests (fp8gu's are a subset), ROUNDS rounds of frames (default 1) and, if
# time is left, fp8all's graph parity. ~560 s on a fresh machine, ~330 s warm. Figures: ab_trees.log,
# ab-results.tgz.
. benchmarks/device/pending/trees.sh
make_tree fp8gu fp8-gate-up.patch
make_tree fp8all fp8-gate-up.patch fp8-qkv.patch
if [ ! -d /tmp/q3tts/full ]; then
  PHASES="setup build snapshot tests parity" BUDGET_S=330 MAX_JOBS=8 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 | tail -6
fi
wait
echo "=== fp8all's product and norm tests ($(left)s left)"
( cd .whl/tree-fp8all && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-fp8all PYTHONPATH=$PWD:/tmp/site_common timeout 120 \
    python3 -m pytest -q tests/device/test_triton_products.py tests/device/test_dependent_launch.py \
    -p no:cacheprovider 2>&1 | tail -8 )
echo "=== ab ($(left)s left)"
PARITY=""; (( $(left) > 340 )) && PARITY=fp8all
TREES="fp8gu fp8all" TEST_TREES="" PARITY_TREES="$PARITY" ROUNDS=${ROUNDS:-1} BUDGET_S=$(( $(left) - 5 )) \
  bash benchmarks/device/ab_trees.sh 2>&1 | grep -E "^(===|\w+[0-9]? (exact|fast) |[0-9]+ (passed|failed)|FAILED)" \
  | cut -c1-400
