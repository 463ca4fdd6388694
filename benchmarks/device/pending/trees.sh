# Sourced by the pending calls (run from the repository root): the call's clock (`left`: seconds left of TOTAL,
# default 570) and `make_tree`, which makes .whl/tree-<name> from the checkout and the named patches of this
# folder, in order, and starts building its extension in the background (a tree made by one call is gone in the
# next: the carried .whl replaces the device's; the extension's cache under /tmp/q3tts stays), and `products_ab`.
S=$(date +%s)
left() { echo $(( ${TOTAL:-570} - ($(date +%s) - S) )); }
make_tree() {  # name, patches (applied in order)
  local T=.whl/tree-$1 name=$1 patch
  shift
  rm -rf "$T" && mkdir -p "$T" && cp -rL pyproject.toml qwen3_tts_native tests benchmarks "$T"/ \
    && ln -s qwen3_tts_native/engine "$T/engine" || return
  for patch in "$@"; do
    (cd "$T" && patch -s -p1 < "$OLDPWD/benchmarks/device/pending/$patch") || return
  done
  echo "tree $name made"
  ( cd "$T" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-$name MAX_JOBS=4 PYTHONPATH=$PWD:/tmp/site_common \
      timeout 250 python3 -m qwen3_tts_native.engine.kernels build > "/tmp/q3tts-build-$name.log" 2>&1
    echo "tree $name build rc=$?" ) &
}
# After the builds: tree $2's product and norm device tests, then `ab_trees.sh` with trees $1 and $2 against the
# checkout (ROUNDS rounds of frames, default 1; $2's graph parity if more than 340 s are left by then).
products_ab() {  # first tree, second tree
  wait
  echo "=== $2's product and norm tests ($(left)s left)"
  ( cd ".whl/tree-$2" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-$2 PYTHONPATH=$PWD:/tmp/site_common timeout 120 \
      python3 -m pytest -q tests/device/test_triton_products.py tests/device/test_dependent_launch.py \
      -p no:cacheprovider 2>&1 | tail -8 )
  echo "=== ab ($(left)s left)"
  local parity=""
  (( $(left) > 340 )) && parity=$2
  TREES="$1 $2" TEST_TREES="" PARITY_TREES="$parity" ROUNDS=${ROUNDS:-1} BUDGET_S=$(( $(left) - 5 )) \
    bash benchmarks/device/ab_trees.sh 2>&1 | grep -E "^(===|\w+[0-9]? (exact|fast) |[0-9]+ (passed|failed)|FAILED)" \
    | cut -c1-400
}
