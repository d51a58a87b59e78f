#!/bin/sh
# Stand-in for registering with the manager (uses a secret the agent masks).
echo "register: POST https://operator:${MANAGER_TOKEN:-s3cr3t-token}@manager.example/api/instances"
echo "register: accepted as worker ${FLIGHTREC_INSTANCE:-unknown}"
