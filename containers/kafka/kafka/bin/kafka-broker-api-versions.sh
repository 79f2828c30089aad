#!/bin/bash
# Stands in for Kafka's tool of this name (compose's health check calls it), which lives in kafka-tools, not among
# the broker's jars: it only checks that the listener of `--bootstrap-server HOST:PORT` accepts connections.
set -euo pipefail
server=localhost:9092
while [ $# -gt 0 ]; do
    case "$1" in
        --bootstrap-server) server="$2"; shift 2 ;;
        *) shift ;;
    esac
done
exec 3<> "/dev/tcp/${server%:*}/${server##*:}"
