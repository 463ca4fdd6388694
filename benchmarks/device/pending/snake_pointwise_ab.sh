#!/usr/bin/env bash
# snake-pointwise.patch (each residual unit's second SnakeBeta and its 1x1 conv as one Triton kernel, the
# activation never written out; tree snakepw, made here from the checkout) against the checkout: the kernel's
# device tests in the tree, then codec packets at 1 / 4 / 16 / 64 streams with their waveforms compared.
# ~300 s on a fresh machine, ~150 s warm. Figures: ab_trees.log (and the codec-packet JSONs).
S=$(date +%s)
left() { echo $(( ${TOTAL:-480} - ($(date +%s) - S) )); }
T=.whl/tree-snakepw
rm -rf "$T" && mkdir -p "$T" && cp -rL pyproject.toml qwen3_tts_native tests benchmarks "$T"/ \
  && ln -s qwen3_tts_native/engine "$T/engine" \
  && (cd "$T" && patch -s -p1 < "$OLDPWD/benchmarks/device/pending/snake-pointwise.patch") && echo "tree snakepw made"
( cd "$T" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-snakepw MAX_JOBS=6 PYTHONPATH=$PWD:/tmp/site_common \
    timeout 250 python3 -m qwen3_tts_native.engine.kernels build > /tmp/q3tts-build-snakepw.log 2>&1; echo "tree snakepw build rc=$?" ) &
if [ ! -d /tmp/q3tts/full ]; then
  PHASES="setup build snapshot" BUDGET_S=250 MAX_JOBS=10 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 | tail -4
fi
wait
echo "=== the tree's kernel tests ($(left)s left)"
( cd "$T" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-snakepw PYTHONPATH=$PWD:/tmp/site_common timeout 120 \
    python3 -m pytest -q tests/device/test_triton_conv.py tests/device/test_dependent_launch.py -p no:cacheprovider 2>&1 | tail -8 )
echo "=== packets ($(left)s left)"
TREES="snakepw" CODEC_TREES="snakepw" TEST_TREES="" FRAME_TIME=0 BUDGET_S=$(( $(left) - 5 )) \
  bash benchmarks/device/ab_trees.sh 2>&1 | grep -v "^\s*$" | tail -70
