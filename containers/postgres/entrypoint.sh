#!/bin/bash
# Initialises the cluster on first start (the official image's contract: POSTGRES_USER, POSTGRES_PASSWORD,
# POSTGRES_DB, /docker-entrypoint-initdb.d), then runs the server as `postgres` in the foreground.
set -euo pipefail

if [ "${1:0:1}" = "-" ]; then
    set -- postgres "$@"
fi
if [ "$1" != "postgres" ]; then
    exec "$@"
fi
if [ "$(id -u)" = "0" ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 0700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

user="${POSTGRES_USER:-postgres}"
database="${POSTGRES_DB:-$user}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "POSTGRES_PASSWORD is not set: the server would accept no password logins over TCP" >&2
        exit 1
    fi
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 ${POSTGRES_INITDB_ARGS:-} >/dev/null
    rm -f "$pwfile"
    cat >> "$PGDATA/postgresql.conf" <<CONF
listen_addresses = '*'
wal_level = logical
max_replication_slots = 10
max_wal_senders = 10
max_connections = 200
CONF
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    # Set-up on the Unix socket only, so that no client sees the server before it is ready.
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
    if [ "$database" != "postgres" ]; then
        psql -v ON_ERROR_STOP=1 --username "$user" --dbname postgres \
            -c "CREATE DATABASE \"$database\"" >/dev/null
    fi
    for script in /docker-entrypoint-initdb.d/*; do
        case "$script" in
            *.sql) psql -v ON_ERROR_STOP=1 --username "$user" --dbname "$database" -f "$script" ;;
            *.sh) . "$script" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "PostgreSQL init process complete; ready for start up."
fi
exec "$@"
