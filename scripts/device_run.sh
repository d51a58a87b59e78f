#!/bin/sh
# The proving core's GPU run as one command, on a bare machine with an NVIDIA driver and no network.
#
#   sh scripts/device_run.sh              on the GPU machine
#   sh scripts/device_run.sh --rehearse   anywhere: the same steps, the NumPy backend standing in for the GPU
#
# Steps: the machine (nvidia-smi, nvcc); flightrec made importable from this checkout (no install,
# no venv needed: a folder of links on PYTHONPATH); wheels carried in .cache/device-wheels
# (`make device-wheels`) installed with pip --no-index, each on its own; pycuda built from the carried
# sdist in the background when nvcc and cuda.h are there (FLIGHTREC_PYCUDA=0 skips it); then
# bench_device (roots, timings, CPU comparison), tests/cuda/test_gpu.py, and
# `flightrec prove bench --print`. Every step's output goes to $OUT (default .flightrec/device-run);
# a step that fails does not stop the next. Extra arguments go to bench_device.
# Environment: PYTHON (python3), OUT, FLIGHTREC_DEVICE_WHEELS, FLIGHTREC_PYCUDA (auto|0), PYCUDA_BUILD_S (300).

set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/.flightrec/device-run}
WHEELS=${FLIGHTREC_DEVICE_WHEELS:-$ROOT/.cache/device-wheels}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flightrec-device.XXXXXX")
mkdir -p "$OUT" "$WORK/site/flightrec" "$WORK/deps" "$WORK/pycuda"

BACKEND=cuda
if [ "${1:-}" = "--rehearse" ]; then
    shift
    BACKEND=cpu
    set -- --roots-k 8,10 --seeds 2 --ks 10,11 --cpu-k 10 --budget-s 60 --no-smi "$@"
    BENCH_K=10
else
    BENCH_K=20
fi

log() { echo "== $*" | tee -a "$OUT/device_run.txt"; }
: >"$OUT/device_run.txt"

log "machine: $(uname -srm), $(nproc 2>/dev/null || echo '?') CPUs, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), backend $BACKEND"
if [ "$BACKEND" = cuda ]; then
    { nvidia-smi || echo "nvidia-smi failed or is missing"; nvcc --version || echo "no nvcc on PATH"; } >>"$OUT/device_run.txt" 2>&1
fi
"$PY" --version >>"$OUT/device_run.txt" 2>&1 || { log "no $PY: set PYTHON to a Python 3.9+"; exit 2; }

# flightrec from this checkout, laid out as its pyproject maps the packages.
for f in "$ROOT"/src/flightrec/*; do ln -s "$f" "$WORK/site/flightrec/"; done
for d in schemas producer consumers analytics cuda broker; do ln -s "$ROOT/$d" "$WORK/site/flightrec/$d"; done

if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    for w in "$WHEELS"/*.whl; do
        if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/deps" "$w" >>"$OUT/device_run.txt" 2>&1; then
            log "installed $(basename "$w")"
        else
            log "could not install $(basename "$w") (another Python's wheel?); going on without it"
        fi
    done
else
    log "no carried wheels in $WHEELS (make device-wheels prepares them); using what this Python has"
fi
export PYTHONPATH="$WORK/site:$WORK/deps${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

# pycuda from its sdist, in the background, while bench_device runs on the ctypes driver.
BUILD_PID=
SDIST=$(ls "$WHEELS"/pycuda-*.tar.gz 2>/dev/null | head -n 1)
CUDA_ROOT_GUESS=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
HAVE_CUDA_H=no; [ -f "$CUDA_ROOT_GUESS/include/cuda.h" ] && HAVE_CUDA_H=yes
if "$PY" -c "import pycuda.driver" 2>/dev/null; then
    log "pycuda is already importable: not building it"
elif [ "$BACKEND" = cuda ] && [ "${FLIGHTREC_PYCUDA:-auto}" != 0 ] && [ -n "$SDIST" ] && [ "$HAVE_CUDA_H" = yes ]; then
    log "building pycuda from $(basename "$SDIST") against $CUDA_ROOT_GUESS in the background (log: pycuda_build.txt)"
    ( CUDA_ROOT="$CUDA_ROOT_GUESS" timeout "${PYCUDA_BUILD_S:-300}" \
        "$PY" -m pip install --no-index --no-build-isolation --no-deps --no-cache-dir --target "$WORK/pycuda" "$SDIST" \
        >"$OUT/pycuda_build.txt" 2>&1; echo "exit $?" >>"$OUT/pycuda_build.txt" ) &
    BUILD_PID=$!
else
    log "not building pycuda (backend $BACKEND, FLIGHTREC_PYCUDA=${FLIGHTREC_PYCUDA:-auto}, sdist ${SDIST:-none}, cuda.h under $CUDA_ROOT_GUESS: $HAVE_CUDA_H)"
fi

log "bench_device --backend $BACKEND $*"
"$PY" -m flightrec.cuda.bench_device --backend "$BACKEND" --json "$OUT/bench_device.json" "$@" >"$OUT/bench_device.txt" 2>&1
BENCH_RC=$?
log "bench_device exit $BENCH_RC"
tail -n 30 "$OUT/bench_device.txt" | grep -v '^RESULT ' | tee -a "$OUT/device_run.txt"

if [ -n "$BUILD_PID" ]; then
    wait "$BUILD_PID"
    if "$PY" -c "import sys; sys.path.insert(0, '$WORK/pycuda'); import pycuda.driver" >>"$OUT/pycuda_build.txt" 2>&1; then
        export PYTHONPATH="$PYTHONPATH:$WORK/pycuda"
        log "pycuda built: tests/cuda/test_gpu.py runs on both drivers"
    else
        log "pycuda did not build (see pycuda_build.txt): the tests run on the ctypes driver"
    fi
fi

log "pytest tests/cuda/test_gpu.py"
(cd "$ROOT" && "$PY" -m pytest tests/cuda/test_gpu.py -q -rs --noconftest -p no:cacheprovider \
    -o addopts="--import-mode=importlib" -W ignore::pytest.PytestConfigWarning) >"$OUT/test_gpu.txt" 2>&1
TEST_RC=$?
log "test_gpu exit $TEST_RC: $(tail -n 1 "$OUT/test_gpu.txt")"

log "flightrec prove bench --backend $BACKEND --k $BENCH_K --print"
"$PY" -m flightrec prove bench --backend "$BACKEND" --k "$BENCH_K" --warmup 1 --proofs 3 --print \
    >"$OUT/prove_bench.txt" 2>&1
PROVE_RC=$?
log "prove bench exit $PROVE_RC: $(tail -n 1 "$OUT/prove_bench.txt")"

rm -rf "$WORK"
log "exit statuses: bench_device $BENCH_RC, test_gpu $TEST_RC, prove bench $PROVE_RC (outputs in $OUT)"
[ "$BENCH_RC" = 0 ] && [ "$TEST_RC" = 0 ] && [ "$PROVE_RC" = 0 ]
