#!/usr/bin/env bash
# ~330 s (warm after another call): a second (and third) round of session 41's 64-row cost,
# the checkout against af25462 (tree base), frames only, the rounds interleaved.
TOTAL=${TOTAL:-330}
. benchmarks/device/pending/trees.sh
if [ ! -d /tmp/q3tts/full ]; then
  build_tree base 6 150
  PHASES="setup build snapshot" BUDGET_S=120 bash benchmarks/device/run_all.sh 2>&1 | tail -12
  wait
fi
echo "=== ab ($(left)s left)"
TREES="base" TEST_TREES="" ROUNDS=${ROUNDS:-2} BUDGET_S=$(( $(left) - 5 )) \
  bash benchmarks/device/ab_trees.sh 2>&1 | grep -v "^\s*$" | tail -80
