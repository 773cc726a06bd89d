# The agents-stream worker. Used by docker-compose.yml (service "worker", which scales:
# `docker compose up --scale worker=3`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package build needs (pyproject.toml: readme + the packages
# agents_stream and tables), so local state (.venv, .data, .cache) never ends
# up in the image. Keep in step with [tool.setuptools] packages.
# constraints.txt: the pinned, audited set `make install` and CI use (docs/security.md, "Dependencies").
COPY pyproject.toml README.md constraints.txt ./
COPY agents_stream ./agents_stream
COPY tables ./tables
# [mcp]: agents may take tools from MCP servers (README "MCP tools"); a worker whose agents name none never imports it.
# [tracing]: OpenTelemetry traces (README "Tracing"), imported only when OTEL_* turns them on.
# [frameworks]: Pydantic AI and OpenAI Agents SDK agents (docs/guide/pydantic-ai.md): not in the default image;
# `docker build --build-arg EXTRAS=mcp,tracing,frameworks .` adds them.
ARG EXTRAS=mcp,tracing
RUN pip install -c constraints.txt --upgrade pip setuptools && pip install -c constraints.txt ".[${EXTRAS}]" && rm -rf /src/build
COPY --chmod=0755 deploy/worker/entrypoint.sh /usr/local/bin/agents-stream-entrypoint

# Each container keeps its RocksDB tables in its own /data (an anonymous volume
# unless one is mounted): replicas must never share one, and a lost one is
# rebuilt from the changelogs. The web views listen on every interface; the
# entrypoint advertises the container's own IP as WEB_HOST (other workers
# forward table reads there, Prometheus scrapes it).
ENV KAFKA_BROKER=kafka://kafka:29092 \
    AGENTS_STREAM_DATA_DIR=/data \
    WEB_PORT=6066 \
    WEB_BIND=0.0.0.0
RUN mkdir -p /data
VOLUME /data
WORKDIR /data

# Faust's web server: health, readiness, /metrics, /tasks, /approvals.
EXPOSE 6066
ENTRYPOINT ["agents-stream-entrypoint"]
CMD ["agents-stream", "worker"]
