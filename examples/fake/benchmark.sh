#!/bin/sh
# Stand-in for the proving benchmark: starts the GPU daemon (which logs to its own file),
# runs warm-up proofs and compares proofs/hour with MIN_RATE. FAKE_GPU_FAIL=1 plays the
# failure that motivated flightrec: the daemon's CUDA error is only in its log file.
log="$1"; min_rate="$2"
"$(dirname "$0")/prover-daemon.sh" "$log" &
sleep 0.3
if [ "${FAKE_GPU_FAIL:-0}" = 1 ]; then
    echo "benchmark: 0 proofs completed"
    echo "benchmark exited with error" >&2
    exit 1
fi
echo "benchmark: 12 proofs in 30.0 s = 1440 proofs/hour (min $min_rate)"
