# Sourced by the pending calls (run from the repository root): the call's clock (`left`: seconds left of TOTAL,
# default 570), `make_tree`, which makes .whl/tree-<name> from the checkout and the named patches of this
# folder, in order, and starts building its extension in the background (a tree made by one call is gone in the
# next: the carried .whl replaces the device's; the extension's cache under /tmp/q3tts stays), and `build_tree`.
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
  build_tree "$name" 4 250
}
# Builds .whl/tree-<name>'s extension in the background into its own kernel cache (ab_trees.sh's), with MAX_JOBS
# and a timeout in seconds; the caller waits for it.
build_tree() {  # name, jobs, timeout
  ( cd ".whl/tree-$1" && QWEN3_TTS_KERNEL_CACHE=/tmp/q3tts/kernel-cache-$1 MAX_JOBS=$2 PYTHONPATH=$PWD:/tmp/site_common \
      timeout "$3" python3 -m qwen3_tts_native.engine.kernels build > "/tmp/q3tts-build-$1.log" 2>&1
    echo "tree $1 build rc=$?" ) &
}
