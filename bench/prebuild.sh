#!/usr/bin/env bash
# bench/prebuild.sh — build GPU binaries HERE (a machine without a GPU) for the device machine,
# so that a short device call spends its time testing and timing, not compiling:
#   bench/prebuild.sh [TARGET...]        (default: test_ce_gpu bench_ce)
# TARGET: a test (test_ce_gpu, test_kl_gpu, ...), a bench (bench_ce, bench_kl, ...) or an example
# (cross_entropy, kl_distill, ...). Each is built by nvcc for sm_90 with the flags of meson.build
# (plus -DLF_HAVE_NCCL -lnccl where NCCL is found and the target uses it) into gpu_bin/tests,
# gpu_bin/bench or gpu_bin/examples, with libstdc++ linked statically (the device machine's
# system libraries differ). gpu_bin/ is git-ignored: name it in the device call's `carry`, then
#   B=gpu_bin bench/gpu_check.sh test bench ...    (no build stage: see gpu_check.sh)
# EXTRA="-DCE_WARP_U=2" and SUFFIX=_u2 build a variant (e.g. bench_ce_u2) for a comparison.
set -u -o pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info gpu_bin/tests gpu_bin/bench gpu_bin/examples
grep -qx "/gpu_bin/" .git/info/exclude 2>/dev/null || echo "/gpu_bin/" >>.git/info/exclude
targets=${*:-test_ce_gpu bench_ce}
flags="-gencode=arch=compute_90,code=sm_90 -std=c++17 -O3 -lineinfo --Werror all-warnings -I. -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc ${EXTRA:-}"
nccl="" # as meson.build finds it: the library in one of these folders, the header beside CUDA's
for d in /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
  if ls $d/libnccl.so* >/dev/null 2>&1 && [ -f /usr/local/cuda/include/nccl.h ]; then nccl="-DLF_HAVE_NCCL -L$d -lnccl"; break; fi
done
rc=0
for t in $targets; do
  case $t in
    test_*) src=tests/$t.cu; dir=tests ;;
    bench_*) src=bench/$t.cu; dir=bench ;;
    *) src=examples/$t.cu; dir=examples ;;
  esac
  [ -f "$src" ] || { echo "prebuild: no $src"; rc=1; continue; }
  extra=""
  case $t in test_tp_gpu|test_cp_gpu|bench_parallel|cp_local_ce|vocab_parallel_ce) extra=$nccl ;; esac
  out=gpu_bin/$dir/$t${SUFFIX:-}
  # one job per core (2 here): each nvcc is single-threaded
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 1; done
  ( nvcc $flags $src -o $out $extra >$out.log 2>&1 && echo "built $out" || { echo "FAILED $out"; tail -5 $out.log; exit 1; } ) &
done
for j in $(jobs -p); do wait $j || rc=1; done
du -sh gpu_bin
exit $rc
