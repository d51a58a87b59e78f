#!/usr/bin/env bash
# The entrypoint of a rented GPU proving instance, written with the flightrec agent.
# Copy it into the image and set the commands below to your real tools; as shipped, the
# FAKE_* defaults point at stand-ins in examples/fake/ so it runs on any machine.
#
# Every stage runs under `flightrec agent run`: its output still reaches this container's
# stdout/stderr byte for byte, its exit code still stops the script (set -e), and every line,
# the daemon's own log file and the exit (code/signal, tails) reach Kafka - spooled on disk
# first, so nothing is lost when the broker is away or the instance is destroyed right after.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
: "${FLIGHTREC_INSTANCE:=$(hostname)}"            # the instance id every event is keyed by
: "${FLIGHTREC_BOOTSTRAP:=localhost:9092}"
: "${FLIGHTREC_REDACT:=MANAGER_TOKEN}"            # values of these env vars never leave the machine
export FLIGHTREC_INSTANCE FLIGHTREC_BOOTSTRAP FLIGHTREC_REDACT
: "${FLIGHTREC:=flightrec}"
: "${WORK:=${TMPDIR:-/tmp}/prover-$FLIGHTREC_INSTANCE}"
: "${DAEMON_LOG:=$WORK/daemon.log}"
: "${MIN_RATE:=1000}"
: "${TUNNEL_CMD:=$here/fake/tunnel.sh}"
: "${REGISTER_CMD:=$here/fake/register.sh}"
: "${PARAMS_CMD:=$here/fake/fetch-params.sh $WORK/params}"
: "${BENCHMARK_CMD:=$here/fake/benchmark.sh $DAEMON_LOG $MIN_RATE}"
: "${SUPERVISOR_CMD:=$here/fake/supervisor.sh}"
mkdir -p "$WORK"

failed_stage=""
stage() {  # stage NAME [--tail PATH]... -- CMD...   (its failure stops the script: set -e)
    local name="$1"; shift
    "$FLIGHTREC" agent run --stage "$name" "$@" || { local rc=$?; failed_stage="$name"; return "$rc"; }
}

# If the script dies before the supervisor's normal end, close the boot anyway, so the
# record of this instance is provably complete before the instance may be destroyed.
stop_tunnel() {
    if [ -n "${tunnel_pid:-}" ]; then
        kill "$tunnel_pid" 2>/dev/null || true
        wait "$tunnel_pid" 2>/dev/null || true   # its agent reports the tunnel's end before the seal
        tunnel_pid=""
    fi
}
on_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        stop_tunnel
        if [ -n "$failed_stage" ]; then
            # failed_stage marks this as a consequence: that stage's own events explain it (one failure, not two)
            "$FLIGHTREC" agent event --stage entrypoint --state failed \
                --detail "entrypoint stopped with $rc: stage $failed_stage failed" --attr failed_stage="$failed_stage" || true
        else
            "$FLIGHTREC" agent event --stage entrypoint --state failed --detail "entrypoint exited with $rc outside any stage" || true
        fi
        # the seal waits until what the failed stage left running can no longer write (the daemon that prints
        # the decisive CUDA error seconds after the benchmark script exited), FLIGHTREC_LATE_WAIT (60 s) at most
        "$FLIGHTREC" agent seal --reason "entrypoint exited with $rc" || true
    fi
    stop_tunnel
    exit "$rc"
}
trap on_exit EXIT

"$FLIGHTREC" agent event --stage entrypoint --state started --attr image="${IMAGE:-unknown}"

# 1. reverse tunnel: runs for the instance's whole life, as a stage of its own in the background
# (the agent itself goes to the background, not a subshell, so $! is the agent: killing it
# passes SIGTERM on to the tunnel once, and the agent reports the tunnel's end)
"$FLIGHTREC" agent run --stage tunnel -- $TUNNEL_CMD &
tunnel_pid=$!

# 2. register with the manager (the token is masked in everything shipped)
stage register -- $REGISTER_CMD

# 3. fetch the proving parameters (progress bars collapse to their final line)
stage params -- $PARAMS_CMD

# 4. benchmark: the GPU daemon writes its errors to its own log, so the agent follows that file;
#    a failure here carries the daemon's last lines in the exit event, and the lines the daemon
#    writes after the script exited are recorded too (marked late).
stage benchmark --tail "$DAEMON_LOG" -- $BENCHMARK_CMD

# 5. production proving. A supervisor stage seals the boot when it ends normally; here the
#    tunnel is stopped first (its end is part of the boot), so the seal comes explicitly after.
stage supervisor --tail "$DAEMON_LOG" --no-seal -- $SUPERVISOR_CMD
stop_tunnel
"$FLIGHTREC" agent event --stage entrypoint --state succeeded
"$FLIGHTREC" agent seal --reason "supervisor ended normally"
