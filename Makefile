# Every target does its own set-up on a fresh machine: virtualenv, Python packages, JVM jars.
# Caches (pip's, and cdcsync's Ivy caches under ~/.cache/cdcsync) make later runs fast and offline.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEPS_STAMP := $(VENV)/.deps-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
JARS_STAMP := $(VENV)/.jars-$(shell cat pyproject.toml cdcsync/runtime/jars.py cdcsync/runtime/ivy.py cdcsync/runtime/cds.py 2>/dev/null | sha1sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: demo test lint unit integration e2e faults soak bench bench-avro bench-blackhole bench-aggregate bench-clickhouse bench-delta bench-lookup bench-peer bench-latency bench-memory compose-check container-images containers-smoke install jars clean

$(DEPS_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@rm -f $(VENV)/.deps-*; touch $@

$(JARS_STAMP): $(DEPS_STAMP) cdcsync/runtime/jars.py cdcsync/runtime/ivy.py cdcsync/runtime/cds.py
	$(BIN)/python -m cdcsync.runtime.jars --with-debezium
	@rm -f $(VENV)/.jars-*; touch $@

install: $(DEPS_STAMP)
jars: $(JARS_STAMP)

lint: install
	$(BIN)/ruff check cdcsync tests benchmarks examples containers
	$(BIN)/ruff format --check cdcsync tests benchmarks examples containers
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

# Long fault variants (1M changes, 100 kills, 60 s outages) carry the `soak` marker: `make soak` only.
# Two pytest-xdist workers: end-to-end tests spend much of their time waiting on Debezium, Kafka and Spark's
# micro-batches, so two of them share 2 cores well. Tests on fixed ports of their own (the fault suite's private
# services) run on one worker, one after another (tests/conftest.py). XDIST= runs everything in one process.
XDIST ?= -n 2 --dist loadgroup
test: jars lint
	$(BIN)/pytest -m "not soak" $(XDIST) $(PYTEST_ARGS)

unit: install
	$(BIN)/pytest -m unit $(PYTEST_ARGS)

integration: jars
	$(BIN)/pytest -m "integration and not soak" $(PYTEST_ARGS)

e2e: jars
	$(BIN)/pytest -m "e2e and not soak" $(PYTEST_ARGS)

# The short version of every fault, then the figures table (fault, injected, changes sent, lost, applied twice,
# time to recover) that docs/operations.md keeps.
faults: jars
	$(BIN)/pytest -m "faults and not soak" $(PYTEST_ARGS)

soak: jars
	$(BIN)/pytest -m soak $(PYTEST_ARGS)

demo: jars
	$(BIN)/python examples/demo.py

bench: jars
	$(BIN)/python benchmarks/upsert.py

bench-avro: jars
	$(BIN)/python benchmarks/upsert.py --format avro

# The blackhole sink's changes/s (the engine's own ceiling) next to the Postgres mirror's, over the same changes.
bench-blackhole: jars
	$(BIN)/python benchmarks/upsert.py --blackhole

bench-aggregate: jars
	$(BIN)/python benchmarks/aggregate.py

bench-clickhouse: jars
	$(BIN)/python benchmarks/clickhouse.py

bench-delta: jars
	$(BIN)/python benchmarks/delta.py

bench-lookup: jars
	$(BIN)/python benchmarks/lookup.py

bench-peer: jars
	$(BIN)/python benchmarks/peer_jdbc_sink.py

bench-latency: jars
	$(BIN)/python benchmarks/latency.py

bench-memory: jars
	$(BIN)/python benchmarks/memory.py

# Validates compose/docker-compose.yml with the Compose specification's reference loader (tools/compose-check),
# and checks that the checker refuses a broken file, so a pass means something.
GO ?= $(shell command -v go || echo /usr/local/go/bin/go)
compose-check:
	cd tools/compose-check && $(GO) build -o $(CURDIR)/.cache/compose-check .
	.cache/compose-check compose/docker-compose.yml
	@if .cache/compose-check tools/compose-check/testdata/broken.yml > /dev/null 2>&1; then \
		echo "compose-check accepted tools/compose-check/testdata/broken.yml: the checker is broken"; exit 1; fi

# Images for CDCSYNC_TEST_STACK=containers and the compose stack, built here because no image registry is
# reachable: a debootstrapped Debian base, Postgres, Kafka, Apicurio Registry, cdcsync, the chDB-based ClickHouse
# stand-in, and for compose Kafka Connect with Debezium, curl and Prometheus (containers/build.py). Idempotent: images whose
# inputs did not change are reused.
container-images: jars
	containers/dockerd-up
	$(BIN)/python containers/build.py

# The tests of each service and one Debezium pipeline through the CLI, through testcontainers on the local images
# (only the four the tests run are built; Kafka Connect runs on the host, as in every test run).
# Services given through CDCSYNC_TEST_* addresses would win over containers: they are unset here. The engine runs on
# this machine (which may itself be a container, where testcontainers would reach services by the bridge's gateway):
# its published ports are on loopback, where Kafka Connect, started on the host by the tests, expects them.
CONTAINERS_SMOKE_TESTS ?= tests/integration/test_introspection.py tests/integration/test_apicurio_registry.py \
	tests/integration/test_clickhouse_sink.py tests/integration/test_migrations_pg.py \
	tests/e2e/test_debezium_source.py::test_debezium_changes_mirror_the_source
containers-smoke: jars
	containers/dockerd-up
	$(BIN)/python containers/build.py --only postgres kafka schema-registry clickhouse
	env -u CDCSYNC_TEST_POSTGRES_DSN -u CDCSYNC_TEST_KAFKA_BOOTSTRAP -u CDCSYNC_TEST_CLICKHOUSE_URL \
		-u CDCSYNC_TEST_SCHEMA_REGISTRY_URL -u CDCSYNC_TEST_CONNECT_URL \
		CDCSYNC_TEST_STACK=containers TESTCONTAINERS_RYUK_DISABLED=true TESTCONTAINERS_CONNECTION_MODE=docker_host \
		CDCSYNC_TEST_NO_SKIPS=1 $$($(BIN)/python containers/build.py --env) \
		$(BIN)/pytest -p no:cacheprovider -rs $(CONTAINERS_SMOKE_TESTS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .cdcsync .pytest_cache .mypy_cache .ruff_cache
