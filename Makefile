# agents-stream: `make run` (broker + worker), `make test` (broker + whole suite).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The local broker is used unless KAFKA_BROKER points elsewhere.
LOCAL_BROKER := $(if $(KAFKA_BROKER),,yes)

.PHONY: install run worker test test-unit test-integration broker broker-stop lint fake-llm clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "agents-stream needs Python 3.11+")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(STAMP)

broker:
	bash scripts/broker.sh start

broker-stop:
	bash scripts/broker.sh stop

# A local broker if KAFKA_BROKER is not set, then one worker with its web views on :$${WEB_PORT:-6066}.
run: install
	@if [ -n "$(LOCAL_BROKER)" ]; then bash scripts/broker.sh start; fi
	$(VENV)/bin/agents-stream worker

worker: install
	$(VENV)/bin/agents-stream worker

fake-llm: install
	$(VENV)/bin/agents-stream fake-llm --port 8089

# The whole suite against a real broker. A broker this target started is stopped again.
test: install
	bash scripts/chromium.sh
	@started=""; \
	if [ -n "$(LOCAL_BROKER)" ] && ! bash scripts/broker.sh status >/dev/null 2>&1; then \
	  bash scripts/broker.sh start || exit $$?; started=yes; \
	fi; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 tests; rc=$$?; \
	if [ -n "$$started" ]; then bash scripts/broker.sh stop; fi; \
	exit $$rc

test-unit: install
	$(PY) -m pytest -q tests/unit tests/agents

lint: install
	$(VENV)/bin/ruff check agents_stream tables tests bench

clean:
	rm -rf .data/worker build *.egg-info
