#!/bin/sh
# Stand-in for a reverse tunnel (autossh/frp): says it is up, then stays until stopped.
echo "tunnel: forwarding relay:22022 -> localhost:22"
trap 'echo "tunnel: closing"; exit 0' TERM INT
while :; do sleep 1; done
