#!/bin/sh
# Stand-in for fetching proving parameters: a carriage-return progress bar, then a file.
mkdir -p "$1"
for p in 0 25 50 75 100; do printf '\rparams: downloading %s%%' "$p"; done
printf '\n'
echo "k=22" > "$1/params.bin"
echo "params: ready in $1"
