#!/usr/bin/env bash
# Session 45, call 1 (~450 s; TOTAL env), made in session 44. The checkout (4989606: the shared-tile samples
# kernel, the grid gate, the conv off the codec's path) against trees conv (+ .whl/conv-wiring.patch: the conv
# wired), conv2 (conv + .whl/samples-staged.patch: the staged 16-byte-vector samples kernel) and conv3 (conv +
# .whl/snake-epilogue.patch: the residual units' second SnakeBeta in the conv's epilogue): device tests,
# codec_conv_ab.py (CONV_AB_TREES, default "conv conv2"), packets at 1 / 4 / 16 / 64 streams (waveforms compared),
# then frames and the lockstep (FRAME_TREES, default the three) while time is left.
S=$(date +%s)
left() { echo $(( ${TOTAL:-450} - ($(date +%s) - S) )); }
for t in conv conv2 conv3; do
  ( cd .whl/tree-$t && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-$t MAX_JOBS=4 PYTHONPATH=$PWD:/tmp/site_common \
      timeout 200 python3 -m qwen3_tts_native.engine.kernels build > /tmp/q3tts-build-$t.log 2>&1; echo "tree $t build rc=$?" ) &
done
PHASES="setup build snapshot" BUDGET_S=150 bash benchmarks/device/run_all.sh 2>&1 | tail -3
wait
for t in checkout conv2 conv3; do
  echo "=== device tests $t ($(left)s left)"
  d=$PWD; c=/tmp/q3tts/kernel-cache; [ $t != checkout ] && d=$PWD/.whl/tree-$t && c=/tmp/q3tts/kernel-cache-$t
  ( cd $d && QWEN3_TTS_KERNEL_CACHE=$c PYTHONPATH=$d:/tmp/site_common timeout 60 python3 -m pytest -q \
      tests/device/test_triton_conv.py tests/device/test_kernel_parity.py -k "triton or conv or time_major or unfold or snake" \
      -p no:cacheprovider 2>&1 | tail -4 )
done
for t in ${CONV_AB_TREES-conv conv2}; do
  echo "=== codec_conv_ab $t ($(left)s left)"
  ( cd benchmarks/device && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-$t PYTHONPATH=$(cd ../.. && pwd)/.whl/tree-$t:/tmp/site_common \
      timeout 40 python3 codec_conv_ab.py --out /tmp/q3tts/results/conv-$t --replays 10 2>&1 | grep -v "^{" | tail -4 )
done
echo "=== ab codec packets ($(left)s left)"
TREES="conv conv2 conv3" CODEC_TREES="conv conv2 conv3" TEST_TREES="" FRAME_TIME=0 BUDGET_S=$(( $(left) - 5 )) \
  bash benchmarks/device/ab_trees.sh 2>&1 | grep -v "^\s*$" | tail -80
echo "=== ab frames and lockstep ($(left)s left)"
TREES="${FRAME_TREES:-conv conv2 conv3}" TEST_TREES="" RUNS=1 BUDGET_S=$(( $(left) - 5 )) \
  bash benchmarks/device/ab_trees.sh 2>&1 | grep -v "^\s*$" | tail -60
