#!/bin/sh
# Prepare .cache/device-wheels for scripts/device_run.sh on a GPU machine that cannot reach PyPI.
#
#   sh scripts/device_wheels.sh [DIR]       (make device-wheels)
#
# What the GPU image lacks (its python3 has numpy, pyarrow, pytest and setuptools): fastavro for
# `flightrec prove bench --print`, and pycuda's sdist with its pure dependencies (pytools,
# platformdirs, mako, siphash24) so that pycuda can be built there against the machine's own
# CUDA toolkit. Binary wheels are for DEVICE_PYTHON (3.12, the image's python3), manylinux x86_64.
# WITH_NVRTC=1 adds nvidia-cuda-nvrtc-cu12 12.4 (23.5 MiB; 12.9 is 85 MiB), for a machine with a driver
# but neither a CUDA toolkit nor NVRTC (the GPU image has both, CUDA 13).
# The folder is gitignored (.cache/); whoever runs the GPU job decides whether to carry it.
# Fails when the folder is over LIMIT_MIB (60).

set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/.cache/device-wheels}
PY=${PYTHON:-$ROOT/.venv/bin/python}
DEVICE_PYTHON=${DEVICE_PYTHON:-3.12}
LIMIT_MIB=${LIMIT_MIB:-60}
mkdir -p "$DIR"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DIR" fastavro pytools platformdirs mako siphash24
"$PY" -m pip download -q --no-deps --no-binary pycuda -d "$DIR" pycuda
if [ "${WITH_NVRTC:-0}" = 1 ]; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d "$DIR" \
        "nvidia-cuda-nvrtc-cu12==12.4.127"
fi
ls -l "$DIR"
SIZE_KIB=$(du -sk "$DIR" | cut -f1)
echo "$DIR: $((SIZE_KIB / 1024)) MiB (limit $LIMIT_MIB MiB)"
[ "$SIZE_KIB" -le $((LIMIT_MIB * 1024)) ] || { echo "over $LIMIT_MIB MiB: carry less" >&2; exit 1; }
