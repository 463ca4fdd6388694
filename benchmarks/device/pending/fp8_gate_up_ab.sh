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
products_ab fp8gu fp8all
