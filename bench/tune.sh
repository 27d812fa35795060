#!/usr/bin/env bash
# bench/tune.sh — build bench_ce (or bench_kl: TUNE_BENCH=bench_kl) with other tile shapes (the
# CE_* / KL_* macros of the examples) and time each, for choosing the defaults. On the device:
#   bench/tune.sh "t512x1:-DCE_THREADS=512 -DCE_CTAS_PER_SM=1 -DCE_PIECE_VECS=4096" ... [-- bench args]
# Each spec is NAME:FLAGS or NAME@DIR:FLAGS (DIR: another copy of the sources, e.g. an older
# commit's, to compare in the same run); results print as RESULT lines with impl=lossfuse_NAME (report.py reads
# them). Builds run in parallel, for sm_90 only; a binary already built is reused, and
# --build-only (first argument) only builds (e.g. in the background while the tests run).
set -u -o pipefail
cd "$(dirname "$0")/.."
build_only=0
[ "${1:-}" = "--build-only" ] && { build_only=1; shift; }
specs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do specs+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
D=${TUNE_DIR:-/tmp/lossfuse_tune}
BENCH=${TUNE_BENCH:-bench_ce}
mkdir -p "$D"
for s in "${specs[@]}"; do
  name=${s%%:*}; flags=${s#*:}; src=.
  case $name in *@*) src=${name#*@}; name=${name%%@*};; esac
  [ -x "$D/${BENCH}_$name" ] && continue
  nvcc -O3 -std=c++17 -arch=sm_90 -lineinfo -I"$src" $flags "$src/bench/$BENCH.cu" -o "$D/${BENCH}_$name" >"$D/$name.log" 2>&1 &
done
wait
[ $build_only = 1 ] && exit 0
for s in "${specs[@]}"; do
  name=${s%%:*}; name=${name%%@*}
  if [ -x "$D/${BENCH}_$name" ]; then "$D/${BENCH}_$name" --tag "_$name" "$@"; else echo "# $name: build failed"; tail -5 "$D/$name.log"; fi
done
