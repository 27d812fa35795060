#!/usr/bin/env bash
# bench/gpu_check.sh — the GPU CI of lossfuse, run on the device machine in one call:
# build, GPU test suite, compute-sanitizer (memcheck + racecheck) on the small cases, benchmarks
# against PyTorch (eager, torch.compile) in the same run, then a short table last.
#   bench/gpu_check.sh [build] [test] [sanitize] [bench] [peers] [klpeers] [packed] [packedpeers]
#                      [tp] [tppeers] [nccl] [tpnccl] [tptorch] [cptorch]
#   (default: all of them; packed: bench_packed, issue 4's DPO / pairwise / segment sums;
#   packedpeers: their PyTorch peers; tp: bench_parallel, issue 5's vocabulary-parallel rank step vs
#   the single-GPU kernel and the cp-local loss vs gather-then-loss; tppeers: PyTorch's vocabulary-parallel pattern on one rank's shard;
#   nccl: issue 5's multi-GPU runs over NCCL (test_tp_gpu / test_cp_gpu --nccl, the two examples in
#   nccl mode, vocab_parallel_ce also one process per GPU) on every GPU seen; tpnccl: bench_parallel --nccl, tp = 2 on two GPUs; tptorch: PyTorch's
#   vocabulary-parallel cross-entropy on the same GPUs over torch.distributed (bench/torch_parallel_peers.py),
#   beside tpnccl's rows in the table; cptorch: PyTorch's context-parallel losses (gather then loss,
#   and the local loss) on CP_NCCL GPUs, with bench_parallel's one-GPU simulation of cp-local.
#   On two H200s (session 37) tpnccl + tptorch took 52 s and tptorch + cptorch 120 s, but their
#   limits add up to more than one 10-minute device call: where they may run long, split them. None of these is in the default list: ask for them on a
#   machine of two GPUs or more)
# (peers: the cross-entropy peers at every bench shape; klpeers: the distillation peers at two
# shapes, since torch.compile takes ~30 s per shape and mode.) One device call runs at most
# 10 minutes: split it, e.g. "build test sanitize" then "build bench peers klpeers".
# Logs and the table/chart go to $OUT (or ./gpu_out). SANITIZE_TESTS narrows the sanitized tests.
# Prebuilt binaries (bench/prebuild.sh, run where there is no GPU; carry gpu_bin): B=gpu_bin and no
# build stage; the test stage then runs the GPU tests found in $B/tests directly, each with
# TEST_ARGS (e.g. "--small", or "--only '[warp]'" for test_ce_gpu), instead of meson test.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
stages=${*:-build test sanitize bench peers klpeers packed packedpeers tp tppeers}
has() { [[ " $stages " == *" $1 "* ]]; }
B=${B:-build-gpu}
summary=()
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"

if has build; then
  t0=$(date +%s)
  if [ ! -d "$B" ]; then meson setup "$B" -Dgpu_archs=90 --buildtype=release >"$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }; fi
  ninja -C "$B" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  summary+=("build: ok ($(( $(date +%s) - t0 )) s)")
fi
if has test && [ ! -f "$B/build.ninja" ]; then # prebuilt: each GPU test binary on its own
  np=0; nf=0; ns=0
  for t in "$B"/tests/test_*_gpu; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    eval timeout "${TEST_TIMEOUT:-600}" "$t" "${TEST_ARGS:-}" >"$OUT/$n.log" 2>&1
    rc=$?
    case $rc in 0) np=$((np + 1)); r=ok ;; 77) ns=$((ns + 1)); r=SKIP ;; *) nf=$((nf + 1)); r="FAIL (rc=$rc)" ;; esac
    echo "$r $n ${TEST_ARGS:-}: $(tail -1 "$OUT/$n.log")"
    grep -E "^FAIL" "$OUT/$n.log" | head -10
  done
  summary+=("tests (prebuilt, ${TEST_ARGS:-full}): $np ok, $nf failed, $ns skipped")
elif has test; then
  meson test -C "$B" --no-rebuild --print-errorlogs >"$OUT/test.log" 2>&1
  grep -E "^ *[0-9]+/[0-9]+ " "$OUT/test.log"
  cp "$B/meson-logs/testlog.txt" "$OUT/testlog.txt" 2>/dev/null
  grep -E "^(ok|FAIL) |FAIL \[|test_(ce|kl|seg|pref|dpo|cp|tp)_gpu:" "$B/meson-logs/testlog.txt" | grep -v "^ok " | tail -40
  summary+=("tests: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$OUT/test.log" | tr -s ' ' | tr '\n' ' ')")
fi
if has sanitize; then
  for t in ${SANITIZE_TESTS:-test_ce_gpu test_kl_gpu test_seg_gpu test_pref_gpu test_dpo_gpu test_cp_gpu test_tp_gpu}; do
    [ -x "$B/tests/$t" ] || continue # prebuilt: only what was built
    # test_tp_gpu: not the cases whose simulated ranks share the GPU (their kernels must run at
    # once; not tried under the sanitizer, which may run kernels one at a time)
    extra=""; [ "$t" = test_tp_gpu ] && extra="--no-sim-windows"
    for tool in memcheck racecheck; do
      log="$OUT/$tool.$t.log"
      timeout ${SANITIZE_TIMEOUT:-200} compute-sanitizer --tool $tool --error-exitcode 9 "$B/tests/$t" --small $extra >"$log" 2>&1
      rc=$?
      summary+=("compute-sanitizer $tool ($t --small): rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1), $(grep "$t:" "$log" | tail -1)")
    done
  done
fi
if has bench; then
  "$B/bench/bench_ce" --variants ${BENCH_ARGS:-} | tee "$OUT/bench.log"
  # fp32 logits and gradient (impl names _f32; no variants): the fp32 gradient's exact form
  "$B/bench/bench_ce" --dtype f32 ${BENCH_ARGS:-} | grep "^RESULT" | tee -a "$OUT/bench.log"
  for v in "$B"/bench/bench_ce_*; do # prebuilt variants (bench/prebuild.sh SUFFIX=_name): bench_ce_name
    [ -x "$v" ] && "$v" --tag "${v##*/bench_ce}" ${BENCH_ARGS:-} | grep "^RESULT" | tee -a "$OUT/bench.log"
  done
  if [ -x "$B/bench/bench_kl" ]; then # (a prebuilt set may leave it out)
    "$B/bench/bench_kl" ${BENCH_KL_ARGS:-} | grep -v "^COPY\|^DEVICE" | tee -a "$OUT/bench.log"
    "$B/bench/bench_kl" --topk 64 ${BENCH_KL_ARGS:-} | grep -v "^COPY\|^DEVICE" | tee -a "$OUT/bench.log"
  fi
fi
if has peers; then
  PYTHONUNBUFFERED=1 timeout ${PEERS_TIMEOUT:-420} python3 bench/torch_peers.py --modes fwdbwd,fwd ${PEERS_ARGS:-} 2>"$OUT/peers.err" | tee -a "$OUT/bench.log"
  tail -5 "$OUT/peers.err"
fi
if has klpeers; then
  PYTHONUNBUFFERED=1 timeout ${PEERS_TIMEOUT:-420} python3 bench/torch_peers.py --no-copy --modes ${KL_PEERS_MODES:-kl_fwd,kl_rev,jsd,kl_fwd_top64,kl_rev_top64,jsd_top64} \
    --impls eager_fp32,compile --iters 10 --shapes ${KL_PEERS_SHAPES:-4096x32768,4096x151936} 2>"$OUT/klpeers.err" | tee -a "$OUT/bench.log"
  tail -5 "$OUT/klpeers.err"
fi
if has packed; then
  "$B/bench/bench_packed" ${BENCH_PACKED_ARGS:-} | tee -a "$OUT/bench.log"
fi
if has packedpeers; then
  PYTHONUNBUFFERED=1 timeout ${PEERS_TIMEOUT:-420} python3 bench/packed_peers.py --no-copy ${PACKED_PEERS_ARGS:-} 2>"$OUT/packedpeers.err" | tee -a "$OUT/bench.log"
  tail -5 "$OUT/packedpeers.err"
fi
if has tp; then
  "$B/bench/bench_parallel" ${BENCH_PARALLEL_ARGS:-} | tee -a "$OUT/bench.log"
fi
if has nccl; then
  ngpu=$(nvidia-smi -L | wc -l)
  for t in ${NCCL_TESTS:-test_tp_gpu test_cp_gpu}; do
    timeout 400 "$B/tests/$t" --nccl >"$OUT/nccl.$t.log" 2>&1
    rc=$?
    grep -E "NCCL" "$OUT/nccl.$t.log" | tail -${NCCL_SHOW:-6}
    summary+=("$t --nccl ($ngpu GPUs): rc=$rc, $(grep "$t:" "$OUT/nccl.$t.log" | tail -1)")
  done
  for m in nccl lsa mp mplsa; do # mp, mplsa: one process per GPU (forked ranks, ncclCommInitRank)
    timeout 120 "$B/examples/vocab_parallel_ce" "$ngpu" 4096 151936 $m >"$OUT/$m.vocab_parallel_ce.log" 2>&1
    summary+=("vocab_parallel_ce $ngpu 4096 151936 $m: rc=$?, $(tail -1 "$OUT/$m.vocab_parallel_ce.log")")
  done
  timeout 120 "$B/examples/cp_local_ce" "$ngpu" 16 32768 nccl >"$OUT/nccl.cp_local_ce.log" 2>&1
  summary+=("cp_local_ce $ngpu 16 32768 nccl: rc=$?, $(tail -1 "$OUT/nccl.cp_local_ce.log")")
  if [ -n "${NCCL_MEMCHECK-1}" ]; then # NCCL_MEMCHECK= (empty) skips the sanitizers
    # NCCL probes its own kernels and peer access through failing API calls: only memory errors count
    timeout ${SANITIZE_TIMEOUT:-200} compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$B/tests/test_tp_gpu" --small --nccl --no-sim-windows >"$OUT/memcheck.nccl.log" 2>&1
    summary+=("compute-sanitizer memcheck (test_tp_gpu --small --nccl): rc=$?, $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.nccl.log" | tail -1), $(grep "test_tp_gpu:" "$OUT/memcheck.nccl.log" | tail -1)")
    for t in test_tp_gpu test_cp_gpu; do # racecheck too (the thread-per-rank paths included)
      extra=""; [ "$t" = test_tp_gpu ] && extra="--no-sim-windows"
      timeout ${SANITIZE_TIMEOUT:-200} compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 9 "$B/tests/$t" --small --nccl $extra >"$OUT/racecheck.nccl.$t.log" 2>&1
      summary+=("compute-sanitizer racecheck ($t --small --nccl): rc=$?, $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.nccl.$t.log" | tail -1), $(grep "$t:" "$OUT/racecheck.nccl.$t.log" | tail -1)")
    done
  fi
fi
if has tpnccl; then
  timeout 300 "$B/bench/bench_parallel" --nccl --tp ${TP_NCCL:-2} --lsa ${TP_LSA:-0:0:0:0,0:0:0:0:1,12:4:0:0} ${BENCH_PARALLEL_ARGS:-} | tee -a "$OUT/bench.log"
fi
if has tptorch; then # PyTorch's vocabulary-parallel pattern on TP_NCCL GPUs, the collectives included
  PYTHONUNBUFFERED=1 timeout ${PEERS_TIMEOUT:-420} python3 bench/torch_parallel_peers.py --no-copy --tp ${TP_NCCL:-2} ${TP_TORCH_ARGS:-} 2>"$OUT/tptorch.err" | tee -a "$OUT/bench.log"
  summary+=("torch_parallel_peers --tp ${TP_NCCL:-2}: rc=${PIPESTATUS[0]} (0 ok; 1 a check failed: see its CHECK lines)")
  tail -5 "$OUT/tptorch.err"
fi
if has cptorch; then # PyTorch's context-parallel losses (gather then loss; local) on CP_NCCL GPUs, and bench_parallel's cp simulation
  timeout 300 "$B/bench/bench_parallel" --tp 0 --cp ${CP_NCCL:-2} ${BENCH_PARALLEL_ARGS:-} | tee -a "$OUT/bench.log"
  PYTHONUNBUFFERED=1 timeout ${PEERS_TIMEOUT:-420} python3 bench/torch_parallel_peers.py --no-copy --cp ${CP_NCCL:-2} ${CP_TORCH_ARGS:-} 2>"$OUT/cptorch.err" | tee -a "$OUT/bench.log"
  summary+=("torch_parallel_peers --cp ${CP_NCCL:-2}: rc=${PIPESTATUS[0]} (0 ok; 1 a check failed: see its CHECK lines)")
  tail -5 "$OUT/cptorch.err"
fi
if has tppeers; then
  PYTHONUNBUFFERED=1 timeout ${PEERS_TIMEOUT:-420} python3 bench/torch_peers.py --no-copy --modes tp2_rank,tp4_rank \
    --impls eager_fp32,compile --iters 10 --shapes ${TP_PEERS_SHAPES:-4096x151936,8192x32768} 2>"$OUT/tppeers.err" | tee -a "$OUT/bench.log"
  tail -5 "$OUT/tppeers.err"
fi
if has bench || has peers || has klpeers || has packed || has packedpeers || has tp || has tppeers || has tpnccl || has tptorch || has cptorch; then
  python3 bench/report.py "$OUT/bench.log" --md "$OUT/results_table.md" --png "$OUT/results.png" >/dev/null 2>"$OUT/report.err" || tail "$OUT/report.err"
fi
echo "================ summary ($(head -1 "$OUT/device.txt"))"
for s in "${summary[@]}"; do echo "$s"; done
[ -f "$OUT/results_table.md" ] && cat "$OUT/results_table.md"
exit 0
