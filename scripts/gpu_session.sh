#!/usr/bin/env bash
# Everything a GPU session measures, in one call from the repository root:
#   OUT=/some/dir bash scripts/gpu_session.sh
# 1. the GPU tests (make test-gpu: compiled kernels, the Triton engine, CUDA graphs against eager
#    steps, the capture within its memory estimate, the device lane's CUDA events), 2. bench
#    graphs (eager against CUDA graphs, beside transformers), 3. bench kernels (decode attention
#    against the copy bandwidth), 4. bench timeline (the device's busy share of wall time from CUDA
#    events, synchronous steps against overlapped; its JSON names the GPU), 5. the quantized paths
#    (scripts/bench_gpu_quant.py: the Triton int8 and int4 products against bfloat16 and against
#    dequantizing the whole weight per call, decode attention over an FP8 cache against
#    bfloat16's, the engine's tokens/s with int8 and int4 weights and the FP8 cache). The GPU
#    tests include the quantized products and the FP8 cache (tests/minicb_kernels).
# Each step has its own time limit (seconds, overridable; together 590) so one slow step cannot
# eat the others';
# every log and result lands in $OUT, and a step that fails does not stop the next.
# It uses the machine's own Python and packages (PY=...), not a fresh virtual environment: a GPU
# machine may have no network to build one. The repository is installed editable, without
# dependencies, so `minicb.kernels` resolves to kernels/.
set -u
OUT=${OUT:?set OUT to the folder the results go to}
mkdir -p "$OUT"
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=$(command -v python3); fi
fi
TESTS_S=${TESTS_S:-210}
GRAPHS_S=${GRAPHS_S:-220}
KERNELS_S=${KERNELS_S:-40}
TIMELINE_S=${TIMELINE_S:-60}
QUANT_S=${QUANT_S:-60}
GRAPHS_ARGS=${GRAPHS_ARGS:-"--repeats 2"}
# the shipped model, two batch sizes, three alternated repeats of each loop: twelve short engines
TIMELINE_ARGS=${TIMELINE_ARGS:-"--batch-sizes 8 64 --steps 40 --repeats 3"}
# three alternated repeats of each quantized linear, attention and engine (sixteen requests)
QUANT_ARGS=${QUANT_ARGS:-"--repeats 3"}
status=0
step() {   # step NAME SECONDS COMMAND...: run it with a limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/session.log"
  local began=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - began))s" | tee -a "$OUT/session.log"
  tail -n 5 "$OUT/$name.log"
  [ "$rc" = 0 ] || status=1
}

{ nvidia-smi; uptime; "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'; "$PY" -m pip list 2>/dev/null | grep -i -E "^(torch|triton|transformers) "; } >"$OUT/machine.txt" 2>&1
"$PY" -m pip install --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
  || echo "editable install failed (see install.log); trying the checkout as it is" | tee -a "$OUT/session.log"
step test-gpu "$TESTS_S" make -o setup test-gpu BIN="$(dirname "$PY")" \
  PYTEST_ADDOPTS="--junitxml=$OUT/test-gpu.xml -q -rs"
# shellcheck disable=SC2086   # GRAPHS_ARGS is a list of flags
step bench-graphs "$GRAPHS_S" "$PY" -m minicb bench graphs --out "$OUT" $GRAPHS_ARGS
step bench-kernels "$KERNELS_S" "$PY" -m minicb bench kernels --out-dir "$OUT"
# shellcheck disable=SC2086   # TIMELINE_ARGS is a list of flags
step bench-timeline "$TIMELINE_S" "$PY" -m minicb bench timeline --device cuda --out-dir "$OUT" \
  $TIMELINE_ARGS
# shellcheck disable=SC2086   # QUANT_ARGS is a list of flags
step bench-quant "$QUANT_S" "$PY" scripts/bench_gpu_quant.py --out-dir "$OUT" $QUANT_ARGS
uptime >>"$OUT/machine.txt"
exit $status
