#!/usr/bin/env bash
# A/B of kernel changes on one machine: the checkout against trees carried under .whl/tree-<name>.
# Run after run_all.sh's setup, build and snapshot phases (same $OUT and work folder). For each tree it
# builds the tree's extension (all at once), runs the tree's kernel device tests, times its frame with
# frame_time.py, then compares each tree with the checkout (`frame_time.py --compare`).
# Make a tree (links resolved; the carry limit is 64 MiB, about 4 MiB a tree):
#   git archive <rev> pyproject.toml qwen3_tts_native engine evidence release schemas tests benchmarks/device \
#     benchmarks/peers | tar -x -C /tmp/t && mkdir .whl/tree-<name> \
#     && cp -rL /tmp/t/{pyproject.toml,qwen3_tts_native,tests,benchmarks} .whl/tree-<name>/
# (benchmarks/peers lets a tree run `qwen3-tts bench` with its peers: run_all.sh's bench phase from the tree.)
# CODEC_TREES also times those trees' codec packets against the checkout's (codec_packet_time.py, waveforms
# compared); PARITY_TREES runs those trees' graph parity tests (tests/device/test_graph_parity.py, full snapshot).
# RUNS: frame_time's timed single-stream requests per mode (default 3). ROUNDS: frame_time rounds, the checkout
# and the trees in turn each round (default 1; with more, tags <name><round> and one comparison a round: a
# machine drifts, and a fixed order would charge the drift to one tree). KBENCH_TABLES: kernel_bench.py tables
# run for the checkout and each tree (e.g. products_in_graph; default none). TEST_TREES: the trees whose kernel
# device tests run (default: all of TREES; "" when run_all.sh's tests phase covers the same kernels).
# FRAME_TIME=0 skips the frame timings (a codec-only change leaves the frames as the checkout's).
# Usage: TREES="attn sampler" [RUNS=3] [ROUNDS=2] [KBENCH_TABLES=products_in_graph] [CODEC_TREES="attn"] \
#   [PARITY_TREES="attn"] [TEST_TREES="attn"] [FRAME_TIME=0] [BUDGET_S=540] bash benchmarks/device/ab_trees.sh
set -uo pipefail
START=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
TREES=${TREES:?name the trees under .whl/tree-<name>}
CODEC_TREES=${CODEC_TREES:-}
PARITY_TREES=${PARITY_TREES:-}
TEST_TREES=${TEST_TREES-$TREES}
OUT=${OUT:-$PWD/out}
WORK=${QWEN3_TTS_WORK:-/tmp/q3tts}
ROOT=$PWD
SNAPSHOT=$WORK/full
RESULTS=$WORK/results/ab
mkdir -p "$OUT" "$RESULTS"
exec > >(tee -a "$OUT/ab_trees.log") 2>&1
export PYTHONUNBUFFERED=1
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
cap() { local l=$(( $(left) - 10 )); (( l < $1 )) && echo "$(( l > 1 ? l : 1 ))" || echo "$1"; }
tree_path() { [ "$1" = checkout ] && echo "$ROOT" || echo "$ROOT/.whl/tree-$1"; }
# A kernel cache per tree: the cache is keyed by the sources' contents, and a tree whose sources equal the
# checkout's would share its build folder, where ninja rebuilds everything when the source paths change (every
# process of the other tree then pays the build: ~40 s of "engine start" in run 136).
kernel_cache() { [ "$1" = checkout ] && echo "$WORK/kernel-cache" || echo "$WORK/kernel-cache-$1"; }

echo "=== building ${TREES} ($(left)s left)"
jobs_each=$(( ${MAX_JOBS:-16} / $(wc -w <<< "$TREES") ))
builds=()
for name in $TREES; do
  ( cd "$(tree_path "$name")" && export QWEN3_TTS_KERNEL_CACHE=$(kernel_cache "$name") && MAX_JOBS=$(( jobs_each > 1 ? jobs_each : 1 )) PYTHONPATH=$PWD:/tmp/site_common \
      timeout "$(cap 240)" python3 -m qwen3_tts_native.engine.kernels build > "$RESULTS/build-$name.log" 2>&1
    echo "build $name rc=$?" ) &
  builds+=($!)
done
wait "${builds[@]}"  # by pid: a bare wait also waits for the log's tee

for name in $TEST_TREES; do
  echo "=== tests/device kernels: $name ($(left)s left)"
  ( cd "$(tree_path "$name")" && export QWEN3_TTS_KERNEL_CACHE=$(kernel_cache "$name") \
      && PYTHONPATH=$PWD:/tmp/site_common timeout "$(cap 120)" python3 -m pytest -q \
      tests/device/test_kernel_parity.py tests/device/test_sampling_kernel.py -p no:cacheprovider 2>&1 | tail -6 )
done

for name in $PARITY_TREES; do
  echo "=== tests/device graph parity: $name ($(left)s left)"
  ( cd "$(tree_path "$name")" && export QWEN3_TTS_KERNEL_CACHE=$(kernel_cache "$name") \
      && PYTHONPATH=$PWD:/tmp/site_common QWEN3_TTS_DEVICE_SNAPSHOT=$SNAPSHOT timeout "$(cap 150)" \
      python3 -m pytest -q tests/device/test_graph_parity.py -p no:cacheprovider 2>&1 | tail -6 )
done

if [ -n "${KBENCH_TABLES:-}" ]; then
  for name in checkout $TREES; do
    echo "=== kernel_bench $KBENCH_TABLES: $name ($(left)s left)"
    ( cd "$ROOT/benchmarks/device" && export QWEN3_TTS_KERNEL_CACHE=$(kernel_cache "$name") \
        && PYTHONPATH=$(tree_path "$name"):/tmp/site_common timeout "$(cap 90)" \
        python3 kernel_bench.py --batches 1,4,64 --tables "$KBENCH_TABLES" --out "$RESULTS/kernel-bench-$name.json" \
        2>&1 | tail -60 )
  done
fi

ROUNDS=${ROUNDS:-1}
FRAME_ROUNDS=$ROUNDS
[ "${FRAME_TIME:-1}" = 0 ] && FRAME_ROUNDS=0
tag() { (( ROUNDS > 1 )) && echo "$1$2" || echo "$1"; }
for round in $(seq 1 "$FRAME_ROUNDS"); do
  for name in checkout $TREES; do
    echo "=== frame_time: $(tag "$name" "$round") ($(left)s left)"
    ( cd "$ROOT/benchmarks/device" && export QWEN3_TTS_KERNEL_CACHE=$(kernel_cache "$name") \
        && PYTHONPATH=$(tree_path "$name"):/tmp/site_common timeout "$(cap 120)" \
        python3 frame_time.py --model "$SNAPSHOT" --out "$RESULTS" --tag "$(tag "$name" "$round")" \
        --runs "${RUNS:-3}" 2>&1 | tail -4 )
  done
done
for round in $(seq 1 "$FRAME_ROUNDS"); do
  for name in $TREES; do
    echo "=== $(tag "$name" "$round") against $(tag checkout "$round")"
    ( cd "$ROOT/benchmarks/device" && python3 frame_time.py --compare "$RESULTS" "$(tag checkout "$round")" \
        "$(tag "$name" "$round")" )
  done
done
if [ -n "$CODEC_TREES" ]; then
  for name in checkout $CODEC_TREES; do
    echo "=== codec_packet_time: $name ($(left)s left)"
    ( cd "$ROOT/benchmarks/device" && export QWEN3_TTS_KERNEL_CACHE=$(kernel_cache "$name") \
        && PYTHONPATH=$(tree_path "$name"):/tmp/site_common timeout "$(cap 90)" \
        python3 codec_packet_time.py --model "$SNAPSHOT" --out "$RESULTS" --tag "$name" 2>&1 | tail -3 )
  done
  for name in $CODEC_TREES; do
    echo "=== $name's codec packets against the checkout's"
    ( cd "$ROOT/benchmarks/device" && python3 codec_packet_time.py --compare "$RESULTS" checkout "$name" )
  done
fi
# One archive, not a file per JSON: a device call returns at most 8 files from $OUT (runs 164 and 166 lost
# their frame JSONs to that limit). $RESULTS holds every ab_trees.sh call of this machine.
tar czf "$OUT/ab-results.tgz" -C "$(dirname "$RESULTS")" --exclude='*.pt' "$(basename "$RESULTS")" 2>/dev/null
echo "=== done ($(left)s left)"
