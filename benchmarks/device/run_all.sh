#!/usr/bin/env bash
# THE device run: set up carried wheels, build the CUDA extension, run tests/device, the kernel
# micro-benchmarks and `qwen3-tts bench` (engine modes + peers) on a full random snapshot made here.
# Everything lands in $OUT (at most 8 files: see README.md). Budget: BUDGET_S seconds in all (default 540).
# PHASES (default: the speed run) picks a subset of: setup build snapshot tests kbench parity bench accept evidence.
# "accept" runs the foundation parity and HTTP scaling acceptance scripts; "evidence" one B1/B3/B6 evidence bundle
# of our server beside faster-qwen3-tts. Run those in a second call: one call cannot fit everything in 10 minutes.
# COMMIT names the bench JSONs (bench-<mode>-<COMMIT>.json) when .git does not travel. KBENCH_TABLES picks the
# kernel micro-benchmark's tables (kernel_bench.py --tables; default all).
# The last lines printed are the summary table (tests, then one row per mode).
set -uo pipefail
START=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
PHASES=${PHASES:-"setup build snapshot tests kbench parity bench"}
OUT=${OUT:-$PWD/out}
WORK=${QWEN3_TTS_WORK:-/tmp/q3tts}
RESULTS=$WORK/results
mkdir -p "$OUT" "$WORK" "$RESULTS"
exec > >(tee -a "$OUT/run_all.log") 2>&1
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
export QWEN3_TTS_KERNEL_CACHE=$WORK/kernel-cache QWEN3_TTS_REPORT_DIR=$RESULTS
export PYTHONPATH=$PWD:/tmp/site_common
SNAPSHOT=$WORK/full

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET_S - $(elapsed) )); }
want() { [[ " $PHASES " == *" $1 "* ]]; }
phase() { echo; echo "=== $1 | ${2:-?}s cap | $(elapsed)s elapsed, $(left)s left"; }
pack() {  # after every phase, so a cut run still returns what it has
  tar czf "$OUT/results.tgz" -C "$WORK" results 2>/dev/null
  cp -f "$RESULTS"/bench-*.json "$RESULTS"/kernel-bench.json "$OUT"/ 2>/dev/null
  true
}
cap() { local want_s=$1; local l; l=$(( $(left) - 15 )); (( l < want_s )) && want_s=$l; (( want_s < 1 )) && want_s=1; echo "$want_s"; }

if want setup; then
  phase setup 60
  pip_target() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }
  common=$(ls .whl/*.whl | grep -v -e faster_qwen3_tts -e qwen_tts_hf)
  pip_target /tmp/site_common $common || exit 1
  pip_target /tmp/site_faster .whl/faster_qwen3_tts-*.whl .whl/qwen_tts_hf-*.whl || exit 1
  pip_target /tmp/site_ref .whl/ref/*.whl || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$RESULTS/gpu.txt"
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
fi

SNAP_PID=""
if want snapshot && [ ! -f "$SNAPSHOT/config.json" ]; then
  phase "snapshot (background)" 240
  ( python3 -m qwen3_tts_native model make-random --preset full --seed 0 --out "$SNAPSHOT" > "$RESULTS/make-random.log" 2>&1 ) &
  SNAP_PID=$!
fi

if want build; then
  phase build 300
  timeout "$(cap 300)" python3 -m qwen3_tts_native.engine.kernels build --verbose > "$RESULTS/build.log" 2>&1
  echo "build rc=$?"; tail -3 "$RESULTS/build.log"
  pack
fi

if want tests; then
  phase "tests/device kernels" 150
  timeout "$(cap 150)" python3 -m pytest -q tests/device/test_kernel_parity.py tests/device/test_triton_products.py tests/device/test_triton_conv.py tests/device/test_sampling_kernel.py tests/device/test_dependent_launch.py tests/device/test_scheduler_on_cuda.py tests/device/test_pcm16_on_cuda.py \
    -p no:cacheprovider --junitxml="$RESULTS/device-kernel-tests.xml" 2>&1 | tail -25
  pack
fi

if want kbench; then
  phase "kernel micro-benchmarks" 90
  timeout "$(cap 90)" python3 benchmarks/device/kernel_bench.py --batches 1,4,64 --out "$RESULTS/kernel-bench.json" \
    ${KBENCH_TABLES:+--tables "$KBENCH_TABLES"} 2>&1 | tail -40
  pack
fi

if [ -n "$SNAP_PID" ]; then
  phase "waiting for the snapshot" "$(left)"
  wait "$SNAP_PID"; echo "make-random rc=$?"; tail -2 "$RESULTS/make-random.log"
fi

if want parity; then
  phase "tests/device graph parity (full snapshot)" 220
  QWEN3_TTS_DEVICE_SNAPSHOT=$SNAPSHOT timeout "$(cap 220)" python3 -m pytest -q tests/device/test_graph_parity.py \
    -p no:cacheprovider --junitxml="$RESULTS/device-graph-tests.xml" 2>&1 | tail -25
  pack
fi

if want bench; then
  phase "qwen3-tts bench" "$(left)"
  timeout "$(cap 100000)" python3 -m qwen3_tts_native bench --model "$SNAPSHOT" --out-dir "$RESULTS" \
    --modes "${BENCH_MODES:-exact,fast}" --frames "${BENCH_FRAMES:-64}" --runs "${BENCH_RUNS:-5}" --ttfa-runs 10 \
    --concurrency 1,3,6,16,64 --concurrency-frames "${BENCH_CONC_FRAMES:-32}" --level-timeout-s 30 \
    --peers "${BENCH_PEERS:-faster,official}" --peer-frames 64 --peer-timeout-s 150 \
    --peer-pythonpath "faster=/tmp/site_faster:/tmp/site_common" \
    --peer-pythonpath "official=/tmp/site_ref:/tmp/site_common" \
    --http-runs 5 2>&1 | tail -60
  pack
fi

if want accept; then
  phase "acceptance: foundation parity vs the official reference (bf16, greedy, 200 frames)" 200
  timeout "$(cap 200)" python3 benchmarks/device/foundation_parity.py --out "$RESULTS" --model "$SNAPSHOT" \
    --ref-pythonpath /tmp/site_ref:/tmp/site_common --modes "${PARITY_MODES:-non_streaming,streaming}" 2>&1 | tail -25
  cp -f "$RESULTS"/foundation-parity.json "$OUT"/ 2>/dev/null
  phase "acceptance: HTTP scaling at 1/4/16 streams" 150
  timeout "$(cap 150)" python3 benchmarks/device/http_scaling.py --out "$RESULTS" --model "$SNAPSHOT" 2>&1 | tail -20
  cp -f "$RESULTS"/http-scaling.json "$OUT"/ 2>/dev/null
  pack
fi

if want evidence; then
  phase "evidence: ours + faster-qwen3-tts, B1/B3/B6, one bundle" 240
  timeout "$(cap 240)" python3 benchmarks/device/evidence_run.py --model "$SNAPSHOT" --zero-eos --out "$OUT" \
    --faster-pythonpath /tmp/site_faster:/tmp/site_common --budget-s "$(( $(cap 240) - 10 ))"
  echo "evidence rc=$?"
  pack
fi

phase done 0
ls -la "$OUT"
echo; echo "=== summary"
python3 - "$RESULTS" <<'PY'
import glob, json, sys, xml.etree.ElementTree as ET
results = sys.argv[1]
for path in sorted(glob.glob(f"{results}/device-*-tests.xml")):
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    bad = [c.get("name") for c in suite.iter("testcase") if any(x.tag in ("failure", "error") for x in c)]
    print(f"{path.rsplit('/', 1)[-1]}: {suite.get('tests')} tests, {len(bad)} failed {bad}")
def f(v, spec=".4f"):
    return format(v, spec) if isinstance(v, (int, float)) else str(v)
print(f"{'mode':<6} {'RTF1':>7} {'loopRTF':>7} {'TTFA50':>7} {'TTFA95':>7} {'agg64':>7} {'worst64':>7} {'memGB':>6}  codec ms (1f/4f)")
for path in sorted(glob.glob(f"{results}/bench-*.json")):
    s = json.load(open(path)).get("summary", {})
    codec = s.get("codec_packet_ms") or {}
    mem = s.get("peak_gpu_memory_bytes_b1")
    print(f"{s.get('mode', '?'):<6} {f(s.get('single_stream_rtf')):>7} {f(s.get('frame_loop_rtf')):>7} "
          f"{f(s.get('ttfa_p50_ms'), '.1f'):>7} {f(s.get('ttfa_p95_ms'), '.1f'):>7} "
          f"{f((s.get('aggregate_rtf') or {}).get('64')):>7} {f((s.get('worst_stream_rtf') or {}).get('64')):>7} "
          f"{f(mem / 1e9 if mem else None, '.2f'):>6}  {f(codec.get('1_frame'), '.2f')}/{f(codec.get('4_frame'), '.2f')}")
    print(f"       peers {s.get('peers')}  codec error {s.get('codec_waveform_error')}")
PY
