#!/usr/bin/env bash
# narrow-splits.patch (the split products of weights of at most 1024 rows, the predictor's o and down, over 8
# blocks of k instead of 4: 128 blocks instead of 64, which the add-RMSNorm kernel adds with one vector a thread)
# against the checkout: the tree's Triton product and dependent-launch device tests, then ROUNDS rounds of
# frames (default 2). Tree narrow, made here from the checkout. ~330 s on a fresh machine, ~200 s warm.
# Figures: ab_trees.log, ab-results.tgz.
S=$(date +%s)
left() { echo $(( ${TOTAL:-540} - ($(date +%s) - S) )); }
T=.whl/tree-narrow
rm -rf "$T" && mkdir -p "$T" && cp -rL pyproject.toml qwen3_tts_native tests benchmarks "$T"/ \
  && ln -s qwen3_tts_native/engine "$T/engine" \
  && (cd "$T" && patch -s -p1 < "$OLDPWD/benchmarks/device/pending/narrow-splits.patch") && echo "tree narrow made"
if [ ! -d /tmp/q3tts/full ]; then
  PHASES="setup build snapshot" BUDGET_S=250 MAX_JOBS=8 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 | tail -4
fi
( cd "$T" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-narrow MAX_JOBS=8 PYTHONPATH=$PWD:/tmp/site_common \
    timeout 250 python3 -m qwen3_tts_native.engine.kernels build > /tmp/q3tts-build-narrow.log 2>&1; echo "tree narrow build rc=$?" )
echo "=== the tree's product tests ($(left)s left)"
( cd "$T" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-narrow PYTHONPATH=$PWD:/tmp/site_common timeout 120 \
    python3 -m pytest -q tests/device/test_triton_products.py tests/device/test_dependent_launch.py -p no:cacheprovider 2>&1 | tail -8 )
echo "=== ab ($(left)s left)"
TREES="narrow" TEST_TREES="" ROUNDS=${ROUNDS:-2} BUDGET_S=$(( $(left) - 5 )) bash benchmarks/device/ab_trees.sh 2>&1 \
  | grep -E "^(===|\w+[0-9]? (exact|fast) )" | cut -c1-400
