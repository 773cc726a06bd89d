#!/bin/sh
# Entry point of the worker image: each replica of `docker compose up --scale worker=N` advertises its own address.
#
# Faust forwards a table read (/tasks/<id>, /jobs/<id>) to the worker owning the key at that worker's advertised
# URL, http://WEB_HOST:WEB_PORT, and Prometheus scrapes every replica. Replicas of one compose service share one
# environment, so the address cannot be written there: unless WEB_HOST is set, a replica advertises its own IP on
# the compose network (what its hostname resolves to), while WEB_BIND=0.0.0.0 (the image's default) keeps
# 127.0.0.1 working for `docker compose exec worker agents-stream ...` and the healthcheck.
set -eu
if [ -z "${WEB_HOST:-}" ]; then
    WEB_HOST="$(python -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')"
    export WEB_HOST
fi
exec "$@"
