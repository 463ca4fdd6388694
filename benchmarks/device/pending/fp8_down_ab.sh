#!/usr/bin/env bash
# Fast mode's down products on e4m3 codes too, against fp8all (`fp8_gate_up_ab.sh`'s tree: the qkv and gate/up
# on e4m3 codes on both sides): tree fp8down (fp8-gate-up.patch, fp8-qkv.patch, then `fp8-down.patch`: the
# SwiGLU kernel writes e4m3 codes with a scale a row per 64 columns, `ops.triton_fp8_linear_swiglu_blocks`, and
# the down product multiplies them as codes, each 64-column step scaled by its block's scales,
# `ops.triton_fp8_block_split_sums`). Best run right after `fp8_gate_up_ab.sh` on the same machine (its
# snapshot and checkout build are reused); on a fresh machine it makes them first (no checkout tests). Then
# fp8down's product device tests, ROUNDS rounds of frames (default 1) and, if time is left, its graph parity.
# ~450 s warm (fp8down's extension builds; fp8all's is cached from `fp8_gate_up_ab.sh`), ~560 s fresh. Figures:
# ab_trees.log, ab-results.tgz.
. benchmarks/device/pending/trees.sh
make_tree fp8all fp8-gate-up.patch fp8-qkv.patch
make_tree fp8down fp8-gate-up.patch fp8-qkv.patch fp8-down.patch
if [ ! -d /tmp/q3tts/full ]; then
  PHASES="setup build snapshot" BUDGET_S=250 MAX_JOBS=8 COMMIT=pending bash benchmarks/device/run_all.sh 2>&1 | tail -6
fi
products_ab fp8all fp8down
