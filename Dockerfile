# cdcsync as a container: `docker build -t cdcsync:local .`, then `docker run cdcsync:local run PIPELINE.yaml`
# with the CDCSYNC__ settings in the environment (compose/docker-compose.yml shows a whole stack).
# Python and a Java 17 runtime (Spark's driver and executors run on it); the Spark Kafka connector's and Delta's jars
# are resolved at build time into the image's cache, so a container starts offline, with Spark's class-data-sharing
# archive (cdcsync.runtime.cds); the dev stack's broker, registry and Connect jars are not in the image.
#
# BASE is any Debian bookworm image: the public python image by default, or (`make container-images`, where no
# image registry is reachable) a debootstrapped Debian with its own python3. cdcsync goes into a virtualenv on
# either, so Debian's externally managed Python is left alone.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

RUN packages="openjdk-17-jre-headless procps" \
    && if ! python3 -c "import ensurepip" 2>/dev/null; then packages="$packages python3 python3-venv"; fi \
    && apt-get update \
    && apt-get install -y --no-install-recommends $packages \
    && rm -rf /var/lib/apt/lists/*

ENV XDG_CACHE_HOME=/opt/cdcsync/cache \
    PATH=/opt/cdcsync/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

# One COPY and one RUN: .dockerignore lets in only pyproject.toml, README.md, cdcsync/ and templates/.
WORKDIR /opt/cdcsync/src
COPY . ./
# Runs as an unprivileged user; state (checkpoints) and rendered migrations live under /var/lib/cdcsync.
RUN python3 -m venv /opt/cdcsync/venv \
    && pip install . \
    && python -c "from cdcsync.runtime import cds, jars; jars.spark_kafka_jars(); cds.build_archive()" \
    && chmod -R a+rX /opt/cdcsync/cache \
    && useradd --system --create-home --home-dir /home/cdcsync cdcsync \
    && mkdir -p /var/lib/cdcsync \
    && chown cdcsync /var/lib/cdcsync
USER cdcsync
WORKDIR /var/lib/cdcsync
ENTRYPOINT ["cdcsync"]
CMD ["--help"]
