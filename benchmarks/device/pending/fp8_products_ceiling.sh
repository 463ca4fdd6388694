#!/usr/bin/env bash
# The talker's 64-row gate/up and down products with e4m3 weights on e4m3 activation rows (wgmma on both codes,
# nothing widened) against bf16 cuBLAS, Triton bf16 and Triton e4m3-weights-only (`triton_products_ceiling.py
# --fp8-rows`, cold weights, 24 calls a graph): whether 1-byte operands end to end halve the products that
# stream their bf16 weights near the bandwidth (NOTES, forty-seventh session). Made-up tensors, no snapshot.
# ~330 s on a fresh machine. Figures: ceiling/triton-products-ceiling-n64.json and the log.
S=$(date +%s)
left() { echo $(( ${TOTAL:-570} - ($(date +%s) - S) )); }
PHASES="setup build" BUDGET_S=150 MAX_JOBS=16 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 | tail -3
echo "=== ceiling ($(left)s left)"
QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache PYTHONPATH=$PWD:/tmp/site_common timeout $(( $(left) - 10 )) \
  python3 benchmarks/device/triton_products_ceiling.py --out "$OUT/ceiling" --shapes talker.gate_up,talker.down \
  --fp8-rows --budget-s $(( $(left) - 40 )) 2>&1 | tee "$OUT/ceiling.log" | tail -12
