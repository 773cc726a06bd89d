# The agents-stream worker. Used by docker-compose.yml (service "worker").
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package build needs (pyproject.toml: readme + the packages
# agents_stream and tables), so local state (.venv, .data, .cache) never ends
# up in the image. Keep in step with [tool.setuptools] packages.
COPY pyproject.toml README.md ./
COPY agents_stream ./agents_stream
COPY tables ./tables
RUN pip install . && rm -rf /src/build

ENV KAFKA_BROKER=kafka://kafka:29092 \
    AGENTS_STREAM_DATA_DIR=/data
RUN mkdir -p /data
VOLUME /data
WORKDIR /data

# Faust's web server (health, metrics).
EXPOSE 6066
CMD ["agents-stream", "worker"]
