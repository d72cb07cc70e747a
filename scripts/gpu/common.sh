# shellcheck shell=bash
# Sourced by the scripts of scripts/gpu/ (not run on its own): what every GPU script
# does alike. A script calls gpu_begin NAME OUT [PART...], then gpu_build and step for
# its work, and ends with gpu_end.
#
# Env, for every script in scripts/gpu/:
#   RESERVOIR_GPU_BUILD  build directory (default build/gpu; Release)
#   CLI11_INCLUDE_DIR    CLI11's headers for reservoir-replay where libcli11-dev is not
#                        installed (the directory holding CLI/CLI.hpp; docs/replay.md)
#   GPU_RUN_SECONDS      the whole run's budget: a step that would start past it is
#                        skipped, a running one is stopped at it (default: no limit)
#   GPU_TARBALL=1        at the end, everything under OUT goes into one file,
#                        OUT/NAME.tar.gz (for a runner that brings back few files)
#   GPU_DRY_RUN=1        print the build and every step's command, run nothing (no GPU
#                        needed: checks a script's parts and arguments)
#   FUZZER               a reservoir_fuzz binary (built with clang elsewhere): while the
#                        GPU steps run on the first cores, a libFuzzer campaign runs on
#                        the last FUZZ_WORKERS cores (default 7) for FUZZ_SECONDS
#                        (default 450) on a copy of tests/corpus; findings and its log
#                        in OUT/fuzz/
set -uo pipefail
gpu_self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
gpu_caller=$PWD  # a relative OUT is taken from here
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1

gpu_b=${RESERVOIR_GPU_BUILD:-build/gpu}
gpu_dry=${GPU_DRY_RUN:-0}
gpu_deadline=${GPU_RUN_SECONDS:-0}
gpu_names=()
gpu_results=()
gpu_fuzz_pid=

# A step may name a function of the script: it then runs as `SCRIPT --fn FUNCTION ARGS`
# (gpu_fn, called by each script once its functions are defined), a process that
# timeout can stop.
gpu_fn() {
  if [ "${1:-}" = --fn ]; then
    shift
    "$@"
    exit $?
  fi
}

# gpu_begin NAME OUT [PART...]: OUT made absolute (in $out), the log teed to
# OUT/NAME.log, the parts asked for in $parts (else the script's defaults,
# $default_parts); the fuzz campaign started when FUZZER is set.
gpu_begin() {
  gpu_name=$1
  out=${2:?usage: scripts/gpu/$1.sh OUT [PART...]}
  shift 2
  [[ $out == /* ]] || out=$gpu_caller/$out
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  export out
  exec > >(tee "$out/$gpu_name.log") 2>&1
  parts=("$@")
  [ ${#parts[@]} -gt 0 ] || read -ra parts <<<"${default_parts:-}"
  local p known=" ${known_parts:-} "
  for p in "${parts[@]}"; do
    [[ $known == *" $p "* ]] || { echo "$gpu_name: unknown part '$p' (parts:${known% })"; exit 2; }
  done
  echo "$gpu_name: parts ${parts[*]} -> $out ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  if ! ((gpu_dry)) && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 4
  fi
  gpu_start_fuzz
}

# wants PART: whether the run asked for PART.
wants() {
  local p
  for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done
  return 1
}

# gpu_torch_dir: python3's torch installation, or nothing.
gpu_torch_dir() {
  python3 -c "import torch,os;print(os.path.dirname(torch.__file__))" 2>/dev/null || true
}

# gpu_build [--torch] TARGET...: configures $gpu_b (Release; PyTorch's c10 with --torch
# when python3 has torch; CLI11_INCLUDE_DIR when set) and builds the targets. The log
# goes to OUT/build.log; a failure prints its tail and returns 1.
gpu_build() {
  local torch_dir=
  if [ "${1:-}" = --torch ]; then
    shift
    torch_dir=$(gpu_torch_dir)
    [ -n "$torch_dir" ] || echo "build: python3 has no torch: no c10 (PyTorch's allocator) column"
  fi
  local configure=(cmake -S . -B "$gpu_b" -DCMAKE_BUILD_TYPE=Release
    ${torch_dir:+-DTORCH_DIR=$torch_dir} ${CLI11_INCLUDE_DIR:+-DCLI11_INCLUDE_DIR=$CLI11_INCLUDE_DIR})
  local build=(cmake --build "$gpu_b" -j"$(nproc)" --target "$@")
  if ((gpu_dry)); then
    echo "[dry run] ${configure[*]} && ${build[*]}"
    return 0
  fi
  { "${configure[@]}" && "${build[@]}"; } >>"$out/build.log" 2>&1 && return 0
  tail -n 25 "$out/build.log"
  echo "build of $* FAILED (log: $out/build.log)"
  return 1
}

# step NAME COMMAND...: runs the command (or a function of the script) within what is
# left of GPU_RUN_SECONDS, and records its status.
step() {
  local name=$1 t=$SECONDS rc limit=()
  shift
  declare -F "$1" >/dev/null && set -- "$gpu_self" --fn "$@"
  echo "=== $name ($(date -u +%H:%M:%S), $SECONDS s into the run)"
  if ((gpu_deadline > 0)); then
    local left=$((gpu_deadline - SECONDS))
    if ((left < 5)); then
      echo "--- $name: skipped (the run's $gpu_deadline s are spent)"
      gpu_names+=("$name")
      gpu_results+=("skipped")
      return 0
    fi
    limit=(timeout "$left")
  fi
  if ((gpu_dry)); then
    echo "[dry run] $*"
    rc=0
  else
    "${limit[@]}" "$@"
    rc=$?
  fi
  gpu_names+=("$name")
  gpu_results+=("$([ $rc = 0 ] && echo ok || echo "FAILED (rc $rc)"), $((SECONDS - t)) s")
  echo "--- $name: ${gpu_results[-1]}"
  return $rc
}

gpu_start_fuzz() {
  [ -n "${FUZZER:-}" ] || return 0
  if [ ! -x "$FUZZER" ] || ((gpu_dry)); then
    echo "fuzz: FUZZER $FUZZER not executable here (or a dry run): no campaign"
    return 0
  fi
  local dir=$out/fuzz workers=${FUZZ_WORKERS:-7} n
  n=$(nproc)
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp tests/corpus/* "$dir/corpus/"
  # This shell, and so every step, keeps the first cores.
  taskset -pc "0-$((n - workers - 1))" $$ >/dev/null
  echo "fuzz: $workers workers on cores $((n - workers))-$((n - 1)) for ${FUZZ_SECONDS:-450} s"
  taskset -c "$((n - workers))-$((n - 1))" "$FUZZER" -fork="$workers" \
    -max_total_time="${FUZZ_SECONDS:-450}" -max_len=1024 -timeout=30 -rss_limit_mb=4096 \
    -detect_leaks=0 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" "$dir/corpus" \
    >"$dir/fuzz.log" 2>&1 &
  gpu_fuzz_pid=$!
}

gpu_finish_fuzz() {
  [ -n "$gpu_fuzz_pid" ] || return 0
  # The campaign ends at FUZZ_SECONDS; past the run's deadline it is stopped.
  while kill -0 "$gpu_fuzz_pid" 2>/dev/null && ((gpu_deadline == 0 || SECONDS < gpu_deadline)); do
    sleep 2
  done
  kill -INT "$gpu_fuzz_pid" 2>/dev/null
  wait "$gpu_fuzz_pid"
  local rc=$?
  gpu_names+=(fuzz-campaign)
  gpu_results+=("$([ $rc = 0 ] && echo ok || echo "rc $rc")")
  grep -E "INITED|DONE|stat::|ERROR|==[0-9]+==" "$out/fuzz/fuzz.log" | tail -n 20
  echo "fuzz: artifacts $(ls "$out/fuzz/artifacts" | wc -l)"
  rm -rf "$out/fuzz/corpus"  # only findings and the log are kept
}

# gpu_end: the fuzz campaign's end, a line per step, the tarball when asked for; exits
# 0 only when every step ran and passed.
gpu_end() {
  gpu_finish_fuzz
  local i status=0
  echo "=== summary ($SECONDS s)"
  for i in "${!gpu_names[@]}"; do
    printf '  %-24s %s\n' "${gpu_names[$i]}" "${gpu_results[$i]}"
    [[ ${gpu_results[$i]} == ok* ]] || status=1
  done
  echo "$gpu_name: $([ $status = 0 ] && echo ok || echo FAILED)"
  if [ "${GPU_TARBALL:-0}" = 1 ] && ! ((gpu_dry)); then
    tar czf "$out.tar.gz" -C "$out" . && rm -rf "${out:?}"/* && mv "$out.tar.gz" "$out/$gpu_name.tar.gz"
  fi
  exit $status
}
