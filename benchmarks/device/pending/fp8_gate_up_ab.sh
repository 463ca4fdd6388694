#!/usr/bin/env bash
# Fast mode's gate/up products of 33-128 rows on e4m3 codes on both sides (tree fp8gu, `fp8-gate-up.patch`:
# `Mode.triton_fp8_swiglu`, the add-RMSNorm before them writing e4m3 rows from the o product's split sums,
# `ops.triton_fp8_linear_swiglu`), against the checkout. On a fresh machine the checkout's kernel device tests
# and graph parity first (rows128 and heads1 landed together after passing each in a tree of its own, runs
# 170-171). Then the tree's product and norm device tests, ROUNDS rounds of frames (default 1) and, if time is
# left, the tree's graph parity. ~560 s on a fresh machine, ~300 s warm. Figures: ab_trees.log, ab-results.tgz.
S=$(date +%s)
left() { echo $(( ${TOTAL:-570} - ($(date +%s) - S) )); }
T=.whl/tree-fp8gu
rm -rf "$T" && mkdir -p "$T" && cp -rL pyproject.toml qwen3_tts_native tests benchmarks "$T"/ \
  && ln -s qwen3_tts_native/engine "$T/engine" \
  && (cd "$T" && patch -s -p1 < "$OLDPWD/benchmarks/device/pending/fp8-gate-up.patch") && echo "tree fp8gu made"
( cd "$T" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-fp8gu MAX_JOBS=4 PYTHONPATH=$PWD:/tmp/site_common \
    timeout 250 python3 -m qwen3_tts_native.engine.kernels build > /tmp/q3tts-build-fp8gu.log 2>&1; echo "tree fp8gu build rc=$?" ) &
if [ ! -d /tmp/q3tts/full ]; then
  PHASES="setup build snapshot tests parity" BUDGET_S=330 MAX_JOBS=8 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 | tail -6
fi
wait
echo "=== fp8gu's product and norm tests ($(left)s left)"
( cd "$T" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-fp8gu PYTHONPATH=$PWD:/tmp/site_common timeout 120 \
    python3 -m pytest -q tests/device/test_triton_products.py tests/device/test_dependent_launch.py \
    -p no:cacheprovider 2>&1 | tail -8 )
echo "=== ab ($(left)s left)"
PARITY=""; (( $(left) > 300 )) && PARITY=fp8gu
TREES=fp8gu TEST_TREES="" PARITY_TREES="$PARITY" ROUNDS=${ROUNDS:-1} BUDGET_S=$(( $(left) - 5 )) \
  bash benchmarks/device/ab_trees.sh 2>&1 | grep -E "^(===|\w+[0-9]? (exact|fast) |[0-9]+ (passed|failed)|FAILED)" \
  | cut -c1-400
