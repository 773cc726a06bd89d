# agents-stream: `make run` (broker + worker), `make test` (broker + whole suite).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The local broker is used unless KAFKA_BROKER points elsewhere.
LOCAL_BROKER := $(if $(KAFKA_BROKER),,yes)

.PHONY: install run worker test test-unit test-integration broker broker-stop lint typecheck audit fake-llm clean chaos bench-peers

# constraints.txt pins the tested set (pip, setuptools and every dependency); pyproject.toml keeps the floors.
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "agents-stream needs Python 3.11+")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt --upgrade pip setuptools
	$(PY) -m pip install -q -c constraints.txt -e '.[test,mcp,tracing,frameworks]'
	touch $@

install: $(STAMP)

broker:
	bash scripts/broker.sh start

broker-stop:
	bash scripts/broker.sh stop

# A local broker if KAFKA_BROKER is not set, then one worker with its web views on :$${WEB_PORT:-6066}; without
# AGENTS_STREAM_API_TOKEN, its token is the local operator token in .data/operator-token (docs/security.md).
# Ctrl-C stops the worker, make broker-stop the broker.
run: install
	@if [ -n "$(LOCAL_BROKER)" ]; then bash scripts/broker.sh start; fi
	$(VENV)/bin/agents-stream worker --local-token

worker: install
	$(VENV)/bin/agents-stream worker

fake-llm: install
	$(VENV)/bin/agents-stream fake-llm --port 8089

# The whole suite against a real broker. A broker this target started is stopped again. tests/unit (pure logic,
# CPU-bound, no broker) runs alongside the setup and tests/integration (real workers, mostly waiting on the broker
# and on timeouts): its output goes to .data/test-unit.log and is printed at the end; any pytest failing fails the
# target. tests/integration runs in two phases: the tests marked `exclusive` one at a time (they restart the shared
# broker, run the job orchestrator, which answers whatever is on the shared agent.jobs, or bound a time that a second
# test's CPU would stretch), then the rest two at a time (pytest-xdist; every other test has its own app id and topics).
# Prometheus and promtool (scripts/prometheus.sh) come first: tests/unit's rule tests run promtool.
# Chromium (scripts/chromium.sh, Debian's packages), iproute2 for the network-partition tests (scripts/netns.sh: they
# make network namespaces, so make test runs as root), the LiteLLM proxy's own venv (scripts/litellm.sh, PyPI) and
# helm for the chart tests (scripts/helm.sh, built through the Go module proxy: minutes from an empty Go cache, so it
# builds niced in the background until the second phase, which needs it; output in .data/helm-build.log) are
# installed while tests/unit runs; the last two are kept once per machine, so a new clone does not install them again.
test: install
	@mkdir -p .data; \
	bash scripts/prometheus.sh || exit $$?; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=10 tests/unit > .data/test-unit.log 2>&1 & unit=$$!; \
	nice -n 19 bash scripts/helm.sh > .data/helm-build.log 2>&1 & helm=$$!; \
	stop_unit() { kill $$unit $$helm 2>/dev/null; wait $$unit $$helm 2>/dev/null; }; \
	bash scripts/chromium.sh || { rc=$$?; stop_unit; exit $$rc; }; \
	bash scripts/netns.sh || { rc=$$?; stop_unit; exit $$rc; }; \
	bash scripts/litellm.sh || { rc=$$?; stop_unit; exit $$rc; }; \
	started=""; \
	if [ -n "$(LOCAL_BROKER)" ] && ! bash scripts/broker.sh status >/dev/null 2>&1; then \
	  bash scripts/broker.sh start || { rc=$$?; stop_unit; exit $$rc; }; started=yes; \
	fi; \
	echo "---- tests/integration, the tests that run alone (-m exclusive) ----"; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=5 -m "exclusive and not long" tests/integration; xrc=$$?; \
	wait $$helm; hrc=$$?; if [ $$hrc -ne 0 ]; then echo "scripts/helm.sh failed ($$hrc):"; cat .data/helm-build.log; fi; \
	echo "---- tests/integration, the rest: two at a time (pytest-xdist) ----"; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 -n 2 -m "not exclusive" tests/integration; \
	rc=$$?; \
	if [ -n "$$started" ]; then bash scripts/broker.sh stop; fi; \
	wait $$unit; urc=$$?; \
	echo "---- tests/unit (run alongside; .data/test-unit.log) ----"; cat .data/test-unit.log; \
	if [ $$xrc -ne 0 ]; then exit $$xrc; fi; if [ $$rc -ne 0 ]; then exit $$rc; fi; if [ $$hrc -ne 0 ]; then exit $$hrc; fi; \
	exit $$urc

# The chaos run at full size (tests/chaos.py, docs/chaos.md): 3 workers, 5,000 tasks, kills, pauses, a broker
# restart; then the long fault runs (pytest -m long: a three-broker cluster with its leader cut off, docs/cluster.md).
# CHAOS_ARGS adds options (e.g. CHAOS_ARGS="--tasks 1000"). A broker this target started is stopped again.
# Against KAFKA_BROKER (not a broker scripts/broker.sh manages) it runs without the broker restart.
chaos: install
	@started=""; \
	if [ -n "$(LOCAL_BROKER)" ] && ! bash scripts/broker.sh status >/dev/null 2>&1; then \
	  bash scripts/broker.sh start || exit $$?; started=yes; \
	fi; \
	if [ -n "$(LOCAL_BROKER)" ]; then bootstrap="127.0.0.1:$${KAFKA_PORT:-9092}"; extra=""; \
	else bootstrap="$$(echo '$(KAFKA_BROKER)' | sed 's#kafka://##g')"; extra="--no-broker-restart"; fi; \
	KAFKA_BOOTSTRAP="$$bootstrap" $(PY) -m tests.chaos --tasks 5000 $$extra $(CHAOS_ARGS); rc=$$?; \
	KAFKA_BOOTSTRAP="$$bootstrap" $(PY) -m pytest -q -s -p no:cacheprovider -m long tests/integration || rc=1; \
	if [ -n "$$started" ]; then bash scripts/broker.sh stop; fi; \
	exit $$rc

test-unit: install
	bash scripts/prometheus.sh
	$(PY) -m pytest -q tests/unit

# ruff, mypy (pyproject [tool.mypy]) and the dependency audit; all run, and any failing fails the target
# (.ci/run stops there).
lint: install
	@rc=0; \
	$(VENV)/bin/ruff check agents_stream tables tests bench || rc=1; \
	$(MAKE) --no-print-directory typecheck || rc=1; \
	$(MAKE) --no-print-directory audit || rc=1; \
	exit $$rc

# pip-audit of the pinned set against security/advisories/ through a local OSV service (no network needed); with
# AUDIT_OSV_URL set, against that OSV service too. Fails on an affected pin or on a dependency it could not audit.
audit: install
	$(PY) -m agents_stream.testing.osv audit -r constraints.txt

# mypy names a module by its path: the link puts tables/ where its installed name (agents_stream.tables) says;
# sed turns the link's paths in the report back into the repository's.
typecheck: install
	@mkdir -p build/typecheck/agents_stream && ln -sfn ../../../tables build/typecheck/agents_stream/tables
	set -o pipefail; $(VENV)/bin/mypy | sed 's#^build/typecheck/agents_stream/tables/#tables/#'

# Benchmarks B1-B8 (bench/run.py): prints the table and writes docs/benchmarks.md; about 12 minutes on 2 cores.
# Not part of `make test`. BENCH_ARGS adds options (e.g. BENCH_ARGS="--quick" or "--only B1,B3"; the support desk's
# cost and latency against the full agent alone: BENCH_ARGS="--only B8 --merge", about 4 minutes).
# A local broker (port $${KAFKA_PORT:-9092}) is started if KAFKA_BROKER is not set and none runs; stopped again after.
.PHONY: bench
bench: install
	@started=""; \
	if [ -n "$(LOCAL_BROKER)" ] && ! bash scripts/broker.sh status >/dev/null 2>&1; then \
	  bash scripts/broker.sh start || exit $$?; started=yes; \
	fi; \
	if [ -n "$(LOCAL_BROKER)" ]; then export KAFKA_BOOTSTRAP="127.0.0.1:$${KAFKA_PORT:-9092}"; fi; \
	$(PY) bench/run.py $(BENCH_ARGS); rc=$$?; \
	if [ -n "$$started" ]; then bash scripts/broker.sh stop; fi; \
	exit $$rc

# The same workload on ours and on Temporal, Restate, DBOS and Quix Streams (bench/peers/), not in `make test`: each
# peer installed from the registries into .data/peers/ (cached; the first run builds Temporal's CLI, minutes), then
# about 8 minutes of runs; writes the peers section of docs/benchmarks.md. PEERS_ARGS adds options
# (e.g. PEERS_ARGS="--only ours,restate"). A broker this target started is stopped again.
bench-peers: install
	@started=""; \
	if [ -n "$(LOCAL_BROKER)" ] && ! bash scripts/broker.sh status >/dev/null 2>&1; then \
	  bash scripts/broker.sh start || exit $$?; started=yes; \
	fi; \
	if [ -n "$(LOCAL_BROKER)" ]; then export KAFKA_BOOTSTRAP="127.0.0.1:$${KAFKA_PORT:-9092}"; fi; \
	$(PY) -m bench.peers.run $(PEERS_ARGS); rc=$$?; \
	if [ -n "$$started" ]; then bash scripts/broker.sh stop; fi; \
	exit $$rc

clean:
	rm -rf .data/worker build *.egg-info
