#!/usr/bin/env bash
# The two pending A/Bs in one call (~480 s on a fresh machine): chain_breaks_ab.sh's frames (one round),
# then snake_pointwise_ab.sh's tests and packets, each capped so that the second still runs.
S=$(date +%s)
left() { echo $(( ${TOTAL:-570} - ($(date +%s) - S) )); }
ROUNDS=${ROUNDS:-1} TOTAL=320 bash benchmarks/device/pending/chain_breaks_ab.sh
echo "=== snake pointwise ($(left)s left)"
TOTAL=$(( $(left) - 5 )) bash benchmarks/device/pending/snake_pointwise_ab.sh
