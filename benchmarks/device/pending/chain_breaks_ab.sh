#!/usr/bin/env bash
# The 64-row frame's remaining cuBLAS breaks of the dependent-launch chain, each on Triton instead, against the
# checkout (trees made here from the checkout and a patch): qkv1 (`qkv-one-kernel.patch`: the qkv product of
# 33-64 rows as one dependently launched Triton kernel without a split, 64 blocks, no reduce kernel) and heads
# (`heads-on-triton.patch`: the 15 predictor heads and the talker's codec head of 33-64 rows as Triton's split
# products and reduce kernel). ROUNDS rounds of frames (default 2). ~360 s on a fresh machine, ~220 s warm.
# Figures: ab_trees.log, ab-results.tgz.
S=$(date +%s)
left() { echo $(( ${TOTAL:-540} - ($(date +%s) - S) )); }
make_tree() {  # name, patch
  local T=.whl/tree-$1
  rm -rf "$T" && mkdir -p "$T" && cp -rL pyproject.toml qwen3_tts_native tests benchmarks "$T"/ \
    && ln -s qwen3_tts_native/engine "$T/engine" \
    && (cd "$T" && patch -s -p1 < "$OLDPWD/benchmarks/device/pending/$2") && echo "tree $1 made"
  ( cd "$T" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-$1 MAX_JOBS=4 PYTHONPATH=$PWD:/tmp/site_common \
      timeout 250 python3 -m qwen3_tts_native.engine.kernels build > "/tmp/q3tts-build-$1.log" 2>&1; echo "tree $1 build rc=$?" ) &
}
make_tree qkv1 qkv-one-kernel.patch
make_tree heads heads-on-triton.patch
if [ ! -d /tmp/q3tts/full ]; then
  PHASES="setup build snapshot" BUDGET_S=250 MAX_JOBS=8 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 | tail -4
fi
wait
echo "=== ab ($(left)s left)"
TREES="qkv1 heads" TEST_TREES="" ROUNDS=${ROUNDS:-2} BUDGET_S=$(( $(left) - 5 )) bash benchmarks/device/ab_trees.sh 2>&1 \
  | grep -E "^(===|\w+[0-9]? (exact|fast) )" | cut -c1-400
