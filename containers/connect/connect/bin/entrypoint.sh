#!/bin/bash
# Writes the distributed worker's properties from the environment (Debezium's image's variables), then runs it.
set -euo pipefail

config="${CONNECT_CONFIG_FILE:-/opt/connect/config/worker.properties}"
mkdir -p "$(dirname "$config")"
{
    echo "bootstrap.servers=${BOOTSTRAP_SERVERS:-kafka:9092}"
    echo "group.id=${GROUP_ID:-1}"
    echo "config.storage.topic=${CONFIG_STORAGE_TOPIC:-connect_configs}"
    echo "offset.storage.topic=${OFFSET_STORAGE_TOPIC:-connect_offsets}"
    echo "status.storage.topic=${STATUS_STORAGE_TOPIC:-connect_statuses}"
    echo "config.storage.replication.factor=${CONFIG_STORAGE_REPLICATION_FACTOR:-1}"
    echo "offset.storage.replication.factor=${OFFSET_STORAGE_REPLICATION_FACTOR:-1}"
    echo "status.storage.replication.factor=${STATUS_STORAGE_REPLICATION_FACTOR:-1}"
    echo "key.converter=${KEY_CONVERTER:-org.apache.kafka.connect.json.JsonConverter}"
    echo "value.converter=${VALUE_CONVERTER:-org.apache.kafka.connect.json.JsonConverter}"
    echo "offset.flush.interval.ms=${OFFSET_FLUSH_INTERVAL_MS:-60000}"
    echo "listeners=http://0.0.0.0:8083"
    echo "rest.advertised.host.name=${ADVERTISED_HOST_NAME:-$(hostname -i | cut -d' ' -f1)}"
    echo "rest.advertised.port=8083"
    echo "plugin.path=/opt/connect/plugins"
    # CONNECT_FOO_BAR=x -> foo.bar=x (later lines win over the defaults above).
    while IFS='=' read -r name value; do
        [ "$name" = CONNECT_CONFIG_FILE ] && continue
        key="${name#CONNECT_}"
        key="${key,,}"
        echo "${key//_/.}=$value"
    done < <(env | grep '^CONNECT_[A-Z0-9_]*=' | sort)
} > "$config"

exec java ${HEAP_OPTS:--Xms128m -Xmx512m} -Djava.awt.headless=true \
    -Dlog4j2.configurationFile=file:/opt/connect/config/log4j2.properties \
    -cp "/opt/connect/libs/*" org.apache.kafka.connect.cli.ConnectDistributed "$config"
