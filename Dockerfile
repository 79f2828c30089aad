# cdcsync as a container: `docker build -t cdcsync:local .`, then `docker run cdcsync:local run PIPELINE.yaml`
# with the CDCSYNC__ settings in the environment (compose/docker-compose.yml shows a whole stack).
# Python and a Java 17 runtime (Spark's driver and executors run on it); the Spark Kafka connector's jars are
# resolved at build time into the image's cache, so a container starts offline.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

ENV XDG_CACHE_HOME=/opt/cdcsync/cache \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/cdcsync/src
COPY pyproject.toml README.md ./
COPY cdcsync ./cdcsync
COPY templates ./templates
RUN pip install . \
    && python -m cdcsync.runtime.jars \
    && chmod -R a+rX /opt/cdcsync/cache

# Runs as an unprivileged user; state (checkpoints) and rendered migrations live under /var/lib/cdcsync.
RUN useradd --system --create-home --home-dir /home/cdcsync cdcsync \
    && mkdir -p /var/lib/cdcsync \
    && chown cdcsync /var/lib/cdcsync
USER cdcsync
WORKDIR /var/lib/cdcsync
ENTRYPOINT ["cdcsync"]
CMD ["--help"]
