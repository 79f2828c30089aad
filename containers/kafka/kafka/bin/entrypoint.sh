#!/bin/bash
# Writes server.properties from the environment (the apache/kafka image's convention), formats the storage once,
# then runs the broker in the foreground.
set -euo pipefail

config="${KAFKA_CONFIG_FILE:-/opt/kafka/config/server.properties}"
data="${KAFKA_LOG_DIRS:-/var/lib/kafka/data}"
not_properties=" KAFKA_HEAP_OPTS KAFKA_OPTS KAFKA_JVM_PERFORMANCE_OPTS KAFKA_LOG4J_OPTS KAFKA_VERSION KAFKA_CONFIG_FILE "

# A single node unless told otherwise: each default applies only where its variable is not set.
: "${KAFKA_NODE_ID:=1}" "${KAFKA_PROCESS_ROLES:=broker,controller}"
: "${KAFKA_LISTENERS:=PLAINTEXT://:9092,CONTROLLER://:9093}"
: "${KAFKA_ADVERTISED_LISTENERS:=PLAINTEXT://localhost:9092}"
: "${KAFKA_CONTROLLER_LISTENER_NAMES:=CONTROLLER}"
: "${KAFKA_LISTENER_SECURITY_PROTOCOL_MAP:=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT}"
: "${KAFKA_CONTROLLER_QUORUM_VOTERS:=1@localhost:9093}"
: "${KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR:=1}" "${KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR:=1}"
: "${KAFKA_TRANSACTION_STATE_LOG_MIN_ISR:=1}" "${KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS:=0}"
export KAFKA_NODE_ID KAFKA_PROCESS_ROLES KAFKA_LISTENERS KAFKA_ADVERTISED_LISTENERS \
    KAFKA_CONTROLLER_LISTENER_NAMES KAFKA_LISTENER_SECURITY_PROTOCOL_MAP KAFKA_CONTROLLER_QUORUM_VOTERS \
    KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR \
    KAFKA_TRANSACTION_STATE_LOG_MIN_ISR KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS
export KAFKA_LOG_DIRS="$data"
: "${KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR:=1}" "${KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR:=1}"
export KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR

# KAFKA_FOO_BAR=x -> foo.bar=x; "___" stands for "-" and "__" for "_", as in the apache/kafka image.
: > "$config"
while IFS='=' read -r name value; do
    case "$not_properties" in *" $name "*) continue ;; esac
    key="${name#KAFKA_}"
    key="${key,,}"
    key="${key//___/-}"
    key="${key//__/@}"
    key="${key//_/.}"
    key="${key//@/_}"
    printf '%s=%s\n' "$key" "$value" >> "$config"
done < <(env | grep '^KAFKA_[A-Z0-9_]*=' | sort)

java_opts=(${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} -XX:+UseG1GC -Djava.awt.headless=true
    -Dlog4j2.configurationFile=file:/opt/kafka/config/log4j2.properties ${KAFKA_OPTS:-}
    -cp "/opt/kafka/libs/*")
mkdir -p "$data"
if [ ! -f "$data/meta.properties" ]; then
    java "${java_opts[@]}" kafka.tools.StorageTool format --ignore-formatted \
        --cluster-id "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" --config "$config"
fi
exec java "${java_opts[@]}" kafka.Kafka "$config"
