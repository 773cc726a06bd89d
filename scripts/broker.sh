#!/usr/bin/env bash
# Local single-node Apache Kafka broker (KRaft mode: broker + controller in one
# JVM) for development and integration tests. The jars come from Maven Central
# through kafka/pom.xml; no Kafka download, no Docker.
#
# Usage: scripts/broker.sh start|stop|status|wait|reset|jars
#
#   start   start the broker in the background and wait until it serves
#           metadata (idempotent: a running broker is left alone)
#   stop    stop the broker named in the PID file (SIGTERM, then SIGKILL)
#   status  print running/stopped; exit 0 if running, 1 if not
#   wait    wait until the running broker is ready
#   reset   stop, then delete the data dir (topics, offsets, logs)
#   jars    only resolve the jars into .cache/kafka/libs (used by kafka-tool)
#
# Environment:
#   KAFKA_PORT             client listener port          (default 9092)
#   KAFKA_CONTROLLER_PORT  KRaft controller port         (default 9093)
#   KAFKA_DATA_DIR         config, data, logs, PID file  (default <repo>/.data/kafka)
#   KAFKA_HEAP_OPTS        JVM heap flags                (default -Xms256m -Xmx1g)
#   KAFKA_START_TIMEOUT    seconds to wait for readiness (default 90)
#
# Alternatives when java/mvn are not available: `docker compose up kafka`, or
# point KAFKA_BROKER at an existing broker.
set -euo pipefail

# Resolve the repo from this file's location so the script works from any cwd.
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"

KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
DATA_DIR="${KAFKA_DATA_DIR:-$REPO_ROOT/.data/kafka}"
HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"

POM="$REPO_ROOT/kafka/pom.xml"
CACHE_DIR="$REPO_ROOT/.cache/kafka"
LIBS_DIR="$CACHE_DIR/libs"
STAMP="$CACHE_DIR/libs.stamp"

LOG_DIR="$DATA_DIR/logs"
LOG_DIRS="$DATA_DIR/data"          # Kafka's log.dirs: topic partitions + KRaft metadata
CONFIG="$DATA_DIR/server.properties"
PID_FILE="$DATA_DIR/broker.pid"
CLUSTER_ID_FILE="$DATA_DIR/cluster.id"
CONSOLE_LOG="$LOG_DIR/console.log"
SERVER_LOG="$LOG_DIR/server.log"

log() { echo "broker.sh: $*" >&2; }

# One clear message when a prerequisite is missing, then exit 2 so callers
# (tests, Makefile) can tell "cannot run here" apart from "failed".
missing() {
    cat >&2 <<EOF
broker.sh: cannot run a local Kafka broker: $1.
  Alternatives: run 'docker compose up kafka' (broker on 127.0.0.1:9092),
  or set KAFKA_BROKER to an existing broker (e.g. kafka://host:9092).
EOF
    exit 2
}

require_java() {
    command -v java >/dev/null 2>&1 || missing "'java' (Java 17 or newer) is not on PATH"
    local version major
    # First line looks like: openjdk version "17.0.15" 2025-04-15 (or "1.8.0_392").
    version="$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')"
    major="${version%%.*}"
    [[ "$major" == 1 ]] && major="$(echo "$version" | cut -d. -f2)"
    if ! [[ "$major" =~ ^[0-9]+$ ]] || ((major < 17)); then
        missing "Kafka 4 needs Java 17 or newer, found java version '${version:-unknown}'"
    fi
}

pom_hash() { sha256sum "$POM" | cut -d' ' -f1; }

jars_ready() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(pom_hash)" ]] && compgen -G "$LIBS_DIR/*.jar" >/dev/null
}

# Copy the broker's jars from Maven (~/.m2 is the download cache) into
# .cache/kafka/libs. Skipped when the stamp matches the pom's hash, so a warm
# start never runs Maven. A lock keeps concurrent callers from racing.
ensure_jars() {
    jars_ready && return 0
    mkdir -p "$CACHE_DIR"
    exec 8>"$CACHE_DIR/.lock"
    flock -w 600 8 || { log "timed out waiting for another jar resolution"; exit 1; }
    if ! jars_ready; then
        command -v mvn >/dev/null 2>&1 || missing "'mvn' (Maven) is not on PATH, and the Kafka jars are not in $LIBS_DIR yet"
        log "resolving Kafka jars with Maven into ${LIBS_DIR#"$REPO_ROOT"/} (first run only)..."
        local tmp="$CACHE_DIR/libs.tmp.$$"
        rm -rf "$tmp"
        # Output kept in a file and shown only on failure (Maven 3.8 -q still
        # prints stray colour codes).
        if ! mvn -q -B -f "$POM" dependency:copy-dependencies \
            -DincludeScope=runtime -DoutputDirectory="$tmp" >"$CACHE_DIR/mvn.log" 2>&1; then
            sed 's/\x1b\[[0-9;]*m//g' "$CACHE_DIR/mvn.log" >&2
            rm -rf "$tmp"
            log "Maven could not resolve the Kafka jars (output above, also in $CACHE_DIR/mvn.log)"
            exit 1
        fi
        # Swap in the complete set at once so nobody sees a half-copied libs dir.
        rm -rf "$LIBS_DIR"
        mv "$tmp" "$LIBS_DIR"
        pom_hash >"$STAMP"
    fi
    exec 8>&-
}

# Run one of Kafka's Java main classes from the same jars (quiet logging).
kafka_java() {
    java -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
        -Dlog4j2.configurationFile="$REPO_ROOT/kafka/log4j2-tools.properties" \
        -cp "$LIBS_DIR/*" "$@"
}

read_pid() { [[ -f "$PID_FILE" ]] && tr -dc '0-9' <"$PID_FILE"; }

# True when the PID file names a live process that really is our broker (a
# recycled PID belonging to something else does not count).
is_running() {
    local pid
    pid="$(read_pid)" || return 1
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'kafka\.Kafka'
}

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# Metadata round trip through the admin client: proves the broker has joined
# the KRaft quorum and serves requests, not just that the socket is bound.
metadata_ok() {
    timeout 30 "$SCRIPT_DIR/kafka-tool" topics \
        --bootstrap-server "127.0.0.1:$KAFKA_PORT" --list >/dev/null 2>&1
}

show_logs() {
    if [[ -s "$SERVER_LOG" ]]; then
        log "last 40 lines of ${SERVER_LOG}:"
        tail -n 40 "$SERVER_LOG" >&2
    fi
    # console.log repeats server.log's WARN/ERROR lines; only show what the
    # JVM printed outside log4j (bad flags, missing class, OutOfMemoryError).
    local jvm_lines
    jvm_lines="$(grep -vE '^(\[|[[:space:]]|Caused by)' "$CONSOLE_LOG" 2>/dev/null | tail -n 40 || true)"
    if [[ -n "$jvm_lines" || ! -s "$SERVER_LOG" ]]; then
        log "last lines of ${CONSOLE_LOG}:"
        echo "${jvm_lines:-$(tail -n 40 "$CONSOLE_LOG" 2>/dev/null)}" >&2
    fi
}

# Wait until the port accepts connections and metadata works, or fail with
# the end of the logs.
wait_ready() {
    local deadline=$((SECONDS + START_TIMEOUT)) pid
    pid="$(read_pid)" || pid=""
    while ((SECONDS < deadline)); do
        # kill -0 rather than is_running: right after the launch the child may
        # not have exec'd java yet, so its command line is still bash's.
        if [[ -z "$pid" ]] || ! kill -0 "$pid" 2>/dev/null; then
            log "the broker is not running (it exited or was never started)"
            show_logs
            return 1
        fi
        if port_open "$KAFKA_PORT" && metadata_ok; then
            log "broker ready on 127.0.0.1:$KAFKA_PORT (pid $pid)"
            return 0
        fi
        sleep 1
    done
    log "broker not ready after ${START_TIMEOUT}s"
    show_logs
    return 1
}

# Written on every start so env var changes (ports) take effect; the data
# itself is kept. Static controller.quorum.voters (rather than --standalone
# with a dynamic quorum) so the controller port is not baked into the data.
write_config() {
    cat >"$CONFIG" <<EOF
# Generated by scripts/broker.sh on every start; edits are overwritten.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT

log.dirs=$LOG_DIRS
num.partitions=1
default.replication.factor=1
log.retention.hours=168

# Topics are created explicitly by the app and the tests, never by accident.
auto.create.topics.enable=false

# Single node: internal topics cannot have more than one replica.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
min.insync.replicas=1

# Fast consumer group joins and short session timeouts for tests.
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
EOF
}

# Format the storage only when the data dir is empty, so restarts keep data.
format_if_needed() {
    mkdir -p "$LOG_DIRS"
    if [[ -n "$(ls -A "$LOG_DIRS")" ]]; then
        return 0
    fi
    if [[ ! -s "$CLUSTER_ID_FILE" ]]; then
        kafka_java kafka.tools.StorageTool random-uuid >"$CLUSTER_ID_FILE"
    fi
    log "formatting new storage in $LOG_DIRS (cluster id $(cat "$CLUSTER_ID_FILE"))"
    kafka_java kafka.tools.StorageTool format \
        --cluster-id "$(cat "$CLUSTER_ID_FILE")" --config "$CONFIG" --ignore-formatted >&2
}

cmd_start() {
    require_java
    mkdir -p "$DATA_DIR" "$LOG_DIR"
    # Serialise concurrent starts (e.g. parallel test sessions).
    exec 9>"$DATA_DIR/.start.lock"
    flock -w 300 9 || { log "timed out waiting for another 'start'"; exit 1; }

    if is_running; then
        if port_open "$KAFKA_PORT"; then
            log "already running (pid $(read_pid)) on 127.0.0.1:$KAFKA_PORT"
            exit 0
        fi
        # Started but not listening yet (another start is still waiting).
        ensure_jars
        wait_ready
        exit $?
    fi
    rm -f "$PID_FILE"
    if port_open "$KAFKA_PORT"; then
        log "port $KAFKA_PORT is already in use by another process; set KAFKA_PORT or stop it"
        exit 1
    fi

    ensure_jars
    write_config
    format_if_needed

    log "starting Kafka on 127.0.0.1:$KAFKA_PORT (logs in $LOG_DIR)"
    # nohup + setsid: the broker outlives this script and is not killed by a
    # Ctrl-C aimed at the caller. All fds are redirected (and the lock fd
    # closed) so callers capturing our output are not held open.
    # shellcheck disable=SC2086  # HEAP_OPTS is a list of JVM flags
    nohup setsid java $HEAP_OPTS -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
        -Djava.awt.headless=true \
        -Dkafka.logs.dir="$LOG_DIR" \
        -Dlog4j2.configurationFile="$REPO_ROOT/kafka/log4j2.properties" \
        -cp "$LIBS_DIR/*" kafka.Kafka "$CONFIG" \
        </dev/null >>"$CONSOLE_LOG" 2>&1 9>&- &
    echo $! >"$PID_FILE"

    if ! wait_ready; then
        log "start failed; stopping the half-started broker"
        cmd_stop >/dev/null 2>&1 || true
        exit 1
    fi
}

cmd_stop() {
    if ! is_running; then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    local pid
    pid="$(read_pid)"
    log "stopping broker (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    # Kafka's controlled shutdown takes a few seconds; give it up to 30 s.
    local i
    for ((i = 0; i < 300; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "still running after 30s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    rm -f "$PID_FILE"
    log "stopped"
}

cmd_status() {
    if is_running; then
        echo "running (pid $(read_pid), 127.0.0.1:$KAFKA_PORT, data $DATA_DIR)"
        return 0
    fi
    echo "stopped"
    return 1
}

cmd_wait() {
    require_java
    if ! is_running; then
        log "not running (start it with: scripts/broker.sh start)"
        exit 1
    fi
    ensure_jars
    wait_ready
}

cmd_reset() {
    cmd_stop
    # Guard against deleting something silly if KAFKA_DATA_DIR is odd.
    if [[ -z "$DATA_DIR" || "$DATA_DIR" == "/" || "$DATA_DIR" == "$REPO_ROOT" ]]; then
        log "refusing to delete data dir '$DATA_DIR'"
        exit 1
    fi
    rm -rf "$DATA_DIR"
    log "deleted $DATA_DIR"
}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

main() {
    case "${1:-}" in
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        wait) cmd_wait ;;
        reset) cmd_reset ;;
        jars) require_java; ensure_jars ;;
        -h | --help | help) usage ;;
        *) usage >&2; exit 64 ;;
    esac
}

main "$@"
