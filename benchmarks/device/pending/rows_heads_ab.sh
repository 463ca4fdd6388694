#!/usr/bin/env bash
# Two more of the 64-row frame's cuBLAS breaks of the dependent-launch chain on Triton, against the checkout
# (trees made here from the checkout and a patch): rows128 (`rows-128.patch`: the Triton products take up to 128
# rows as two activation tiles, `Mode.triton_max_rows` 128, so the predictor's first step at 64 streams, 128
# rows, leaves cuBLAS and `silu_mul`; prompt passes of 65-128 rows too) and heads1 (`heads-one-kernel.patch`:
# the 15 predictor heads and the codec head of 33-64 rows on the one-kernel product that qkv took in 156c863).
# rows128's Triton product and dependent-launch device tests first, then ROUNDS rounds of frames (default 2).
# On a fresh machine the checkout's kernel device tests run first (5d08afa merged the product kernels after the
# last device call). ~420 s on a fresh machine, ~240 s warm. Figures: ab_trees.log, ab-results.tgz.
S=$(date +%s)
left() { echo $(( ${TOTAL:-560} - ($(date +%s) - S) )); }
make_tree() {  # name, patch
  local T=.whl/tree-$1
  rm -rf "$T" && mkdir -p "$T" && cp -rL pyproject.toml qwen3_tts_native tests benchmarks "$T"/ \
    && ln -s qwen3_tts_native/engine "$T/engine" \
    && (cd "$T" && patch -s -p1 < "$OLDPWD/benchmarks/device/pending/$2") && echo "tree $1 made"
  ( cd "$T" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-$1 MAX_JOBS=4 PYTHONPATH=$PWD:/tmp/site_common \
      timeout 250 python3 -m qwen3_tts_native.engine.kernels build > "/tmp/q3tts-build-$1.log" 2>&1; echo "tree $1 build rc=$?" ) &
}
make_tree rows128 rows-128.patch
make_tree heads1 heads-one-kernel.patch
if [ ! -d /tmp/q3tts/full ]; then
  PHASES="setup build snapshot tests" BUDGET_S=290 MAX_JOBS=8 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 | tail -6
fi
wait
echo "=== rows128's product tests ($(left)s left)"
( cd .whl/tree-rows128 && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-rows128 PYTHONPATH=$PWD:/tmp/site_common timeout 120 \
    python3 -m pytest -q tests/device/test_triton_products.py tests/device/test_dependent_launch.py -p no:cacheprovider 2>&1 | tail -8 )
echo "=== ab ($(left)s left)"
TREES="rows128 heads1" TEST_TREES="" ROUNDS=${ROUNDS:-2} BUDGET_S=$(( $(left) - 5 )) bash benchmarks/device/ab_trees.sh 2>&1 \
  | grep -E "^(===|\w+[0-9]? (exact|fast) )" | cut -c1-400
