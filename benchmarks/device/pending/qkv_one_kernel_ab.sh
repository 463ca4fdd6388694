#!/usr/bin/env bash
# qkv-one-kernel.patch (the qkv product of 33-64 rows as one dependently launched Triton kernel without a split:
# 64 blocks, no reduce kernel; tree qkv1, made here from the checkout) against the checkout's cuBLAS qkv, two
# rounds of frames. ~330 s on a fresh machine, ~160 s warm. Figures: ab_trees.log.
S=$(date +%s)
left() { echo $(( ${TOTAL:-480} - ($(date +%s) - S) )); }
T=.whl/tree-qkv1
rm -rf "$T" && mkdir -p "$T" && cp -rL pyproject.toml qwen3_tts_native tests benchmarks "$T"/ \
  && ln -s qwen3_tts_native/engine "$T/engine" \
  && (cd "$T" && patch -s -p1 < "$OLDPWD/benchmarks/device/pending/qkv-one-kernel.patch") && echo "tree qkv1 made"
( cd "$T" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-qkv1 MAX_JOBS=6 PYTHONPATH=$PWD:/tmp/site_common \
    timeout 250 python3 -m qwen3_tts_native.engine.kernels build > /tmp/q3tts-build-qkv1.log 2>&1; echo "tree qkv1 build rc=$?" ) &
if [ ! -d /tmp/q3tts/full ]; then
  PHASES="setup build snapshot" BUDGET_S=250 MAX_JOBS=10 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 | tail -4
fi
wait
echo "=== ab ($(left)s left)"
TREES="qkv1" TEST_TREES="" ROUNDS=${ROUNDS:-2} BUDGET_S=$(( $(left) - 5 )) bash benchmarks/device/ab_trees.sh 2>&1 \
  | grep -v "^\s*$" | tail -40
