#!/bin/sh
# Install the Debian tools that tests and benchmarks use, when they are missing.
# Needs root and apt-get; elsewhere it says what to install and goes on.
need=""
command -v kcat >/dev/null 2>&1 || need="$need kcat"
command -v chromium >/dev/null 2>&1 || need="$need chromium"
# PostgreSQL's server programs, for `flightrec catalog` (a lake's catalog) and the tests' catalog fixture
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || need="$need postgresql"
# promtool, from Prometheus itself, evaluates the shipped alert rules in the tests (examples/prometheus/)
command -v promtool >/dev/null 2>&1 || need="$need prometheus"
[ -z "$need" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages:$need"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
else
  echo "please install these Debian packages:$need (tests that need them will fail without them)" >&2
fi
