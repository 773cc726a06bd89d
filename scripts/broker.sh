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
#   KAFKA_SASL_PORT        SASL_PLAINTEXT listener port  (default 9094)
#   KAFKA_SASL_SSL_PORT    SASL_SSL listener port        (default 9095)
#   KAFKA_DATA_DIR         config, data, logs, PID file  (default <repo>/.data/kafka)
#   KAFKA_HEAP_OPTS        JVM heap flags                (default -Xms256m -Xmx1g)
#   KAFKA_START_TIMEOUT    seconds to wait for readiness (default 90)
#   KAFKA_ACLS             1: enable Kafka's StandardAuthorizer (default off).
#                          The SASL listeners' users then need ACLs (scripts/acls.sh,
#                          docs/security.md); PLAINTEXT clients, the controller and the
#                          inter-broker listener are User:ANONYMOUS, a super user.
#
# Listeners, all on 127.0.0.1: PLAINTEXT (KAFKA_PORT, no authentication),
# SASL_PLAINTEXT (KAFKA_SASL_PORT) and SASL_SSL (KAFKA_SASL_SSL_PORT), both
# with the mechanisms PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512. LOCAL-ONLY test
# credentials, the same for every mechanism: user "agents", password
# "agents-local-secret". The SASL_SSL listener's certificate is made once per
# data dir by a throwaway CA; clients trust <data dir>/tls/ca.pem. Client
# settings for Kafka's tools (scripts/kafka-tool TOOL --command-config FILE):
# <data dir>/client-sasl.properties (SCRAM-SHA-512 over SASL_PLAINTEXT) and
# <data dir>/client-sasl-ssl.properties (PLAIN over SASL_SSL).
#
# Alternatives when java/mvn are not available: `docker compose up kafka`, or
# point KAFKA_BROKER at an existing broker.
set -euo pipefail

# Resolve the repo from this file's location so the script works from any cwd.
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"

KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
KAFKA_SASL_PORT="${KAFKA_SASL_PORT:-9094}"
KAFKA_SASL_SSL_PORT="${KAFKA_SASL_SSL_PORT:-9095}"
DATA_DIR="${KAFKA_DATA_DIR:-$REPO_ROOT/.data/kafka}"
HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
ACLS="${KAFKA_ACLS:-0}"

POM="$REPO_ROOT/kafka/pom.xml"
CACHE_DIR="$REPO_ROOT/.cache/kafka"
LIBS_DIR="$CACHE_DIR/libs"
STAMP="$CACHE_DIR/libs.stamp"

LOG_DIR="$DATA_DIR/logs"
LOG_DIRS="$DATA_DIR/data"          # Kafka's log.dirs: topic partitions + KRaft metadata
CONFIG="$DATA_DIR/server.properties"
PID_FILE="$DATA_DIR/broker.pid"
CLUSTER_ID_FILE="$DATA_DIR/cluster.id"
TLS_DIR="$DATA_DIR/tls"
TLS_CA="$TLS_DIR/ca.pem"             # the CA certificate clients trust
TLS_KEYSTORE="$TLS_DIR/broker.pem"   # the broker's key and certificate chain
SCRAM_STAMP="$DATA_DIR/scram-users"  # the SCRAM users this data dir has

# Fixed credentials of the local broker: local development and tests only.
SASL_USER="agents"
SASL_PASSWORD="agents-local-secret"
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
        if port_open "$KAFKA_PORT" && port_open "$KAFKA_SASL_PORT" && port_open "$KAFKA_SASL_SSL_PORT" && metadata_ok; then
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
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_SSL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_SSL_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL

# Client authentication on the SASL listeners (LOCAL-ONLY credentials, see the
# header). The PLAIN user lives in the JAAS config below, the SCRAM user in the
# cluster metadata (added by format_if_needed or ensure_scram_users).
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
$(for listener in sasl_plaintext sasl_ssl; do
        echo "listener.name.$listener.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$SASL_USER=\"$SASL_PASSWORD\";"
        echo "listener.name.$listener.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
        echo "listener.name.$listener.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
    done)
# The SASL_SSL listener's TLS: an unencrypted PKCS#8 key and its certificate
# chain in one PEM file (ensure_tls). No client certificates.
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$TLS_KEYSTORE

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
    if [[ "$ACLS" == 1 ]]; then
        # Opt-in (KAFKA_ACLS=1): a SASL user gets what its ACLs allow and nothing without one. Every
        # unauthenticated connection is User:ANONYMOUS: the PLAINTEXT listener (tests, the admin commands of
        # scripts/acls.sh), the controller listener and inter-broker traffic, so it stays a super user here.
        # LOCAL ONLY: a cluster with ACLs must not offer an unauthenticated listener (docs/security.md).
        cat >>"$CONFIG" <<'EOF'

# KAFKA_ACLS=1: ACLs on, deny by default; User:ANONYMOUS (PLAINTEXT, controller, inter-broker) is a super user.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS
EOF
    fi
    # Client settings for Kafka's own tools on the SASL listeners.
    cat >"$DATA_DIR/client-sasl.properties" <<EOF
# scripts/kafka-tool TOOL --bootstrap-server 127.0.0.1:$KAFKA_SASL_PORT --command-config $DATA_DIR/client-sasl.properties
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$SASL_USER" password="$SASL_PASSWORD";
EOF
    cat >"$DATA_DIR/client-sasl-ssl.properties" <<EOF
# scripts/kafka-tool TOOL --bootstrap-server 127.0.0.1:$KAFKA_SASL_SSL_PORT --command-config $DATA_DIR/client-sasl-ssl.properties
security.protocol=SASL_SSL
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="$SASL_USER" password="$SASL_PASSWORD";
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_CA
EOF
}

# The SASL_SSL listener's key and certificate, made once per data dir (never
# committed: the data dir is git-ignored) by a throwaway CA whose key is
# deleted after signing. PEM files, so no keytool and no store passwords. The
# certificate names 127.0.0.1 and localhost, which clients verify.
ensure_tls() {
    [[ -s "$TLS_KEYSTORE" && -s "$TLS_CA" ]] && return 0
    command -v openssl >/dev/null 2>&1 \
        || missing "'openssl' is not on PATH (needed once, to make the SASL_SSL listener's certificate)"
    log "making the SASL_SSL listener's certificate in $TLS_DIR"
    local tmp="$TLS_DIR.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    # The extensions strict verifiers (e.g. Python 3.13's default) insist on.
    cat >"$tmp/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
[dn]
[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[broker_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
    if ! (
        set -e
        cd "$tmp"
        openssl req -x509 -new -newkey rsa:2048 -nodes -sha256 -days 3650 -config openssl.cnf \
            -extensions ca_ext -subj "/CN=agents-stream local test CA" -keyout ca.key -out ca.pem
        openssl req -new -newkey rsa:2048 -nodes -sha256 -config openssl.cnf \
            -subj "/CN=localhost" -keyout broker.key -out broker.csr
        openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 -days 3650 \
            -extfile openssl.cnf -extensions broker_ext -out broker.crt
        # OpenSSL 3 writes unencrypted keys as PKCS#8, which Kafka's PEM keystore needs.
        cat broker.key broker.crt ca.pem >broker.pem
        rm -f ca.key ca.srl broker.key broker.csr broker.crt openssl.cnf
        chmod 600 broker.pem
    ) >"$tmp.log" 2>&1; then
        cat "$tmp.log" >&2
        rm -rf "$tmp" "$tmp.log"
        log "openssl could not make the certificate (output above)"
        exit 1
    fi
    rm -rf "$TLS_DIR" "$tmp.log"
    mv "$tmp" "$TLS_DIR"
}

scram_stamp() { echo "$SASL_USER $(printf '%s' "$SASL_PASSWORD" | sha256sum | cut -c1-16)"; }

# Make sure the SCRAM user exists (running broker). A data dir formatted
# before the SASL listeners existed has none; the stamp keeps warm starts from
# running the tool again.
ensure_scram_users() {
    [[ -f "$SCRAM_STAMP" && "$(cat "$SCRAM_STAMP")" == "$(scram_stamp)" ]] && return 0
    log "adding the SCRAM user '$SASL_USER' (SCRAM-SHA-256, SCRAM-SHA-512)"
    local mechanism
    # One mechanism per run: the broker refuses two changes to one user in one request.
    for mechanism in SCRAM-SHA-256 SCRAM-SHA-512; do
        if ! timeout 60 "$SCRIPT_DIR/kafka-tool" configs --bootstrap-server "127.0.0.1:$KAFKA_PORT" --alter \
            --entity-type users --entity-name "$SASL_USER" \
            --add-config "$mechanism=[password=$SASL_PASSWORD]" >/dev/null; then
            log "could not add the SCRAM user; $mechanism logins fail until the next start tries again"
            return 1
        fi
    done
    scram_stamp >"$SCRAM_STAMP"
}

show_listeners() {
    log "listeners: PLAINTEXT 127.0.0.1:$KAFKA_PORT, SASL_PLAINTEXT 127.0.0.1:$KAFKA_SASL_PORT," \
        "SASL_SSL 127.0.0.1:$KAFKA_SASL_SSL_PORT (CA $TLS_CA; local-only user $SASL_USER," \
        "mechanisms PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)"
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
        --cluster-id "$(cat "$CLUSTER_ID_FILE")" --config "$CONFIG" --ignore-formatted \
        --add-scram "SCRAM-SHA-256=[name=$SASL_USER,password=$SASL_PASSWORD]" \
        --add-scram "SCRAM-SHA-512=[name=$SASL_USER,password=$SASL_PASSWORD]" >&2
    scram_stamp >"$SCRAM_STAMP"
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
            if port_open "$KAFKA_SASL_PORT" && port_open "$KAFKA_SASL_SSL_PORT"; then
                ensure_scram_users || true
                show_listeners
            else
                log "its SASL listeners (127.0.0.1:$KAFKA_SASL_PORT, 127.0.0.1:$KAFKA_SASL_SSL_PORT) are not open:" \
                    "it was started by an older broker.sh; restart it (scripts/broker.sh stop && scripts/broker.sh start)"
            fi
            exit 0
        fi
        # Started but not listening yet (another start is still waiting).
        ensure_jars
        wait_ready || exit $?
        ensure_scram_users || true
        show_listeners
        exit 0
    fi
    rm -f "$PID_FILE"
    local port
    for port in "$KAFKA_PORT" "$KAFKA_SASL_PORT" "$KAFKA_SASL_SSL_PORT"; do
        if port_open "$port"; then
            log "port $port is already in use by another process; set KAFKA_PORT, KAFKA_SASL_PORT," \
                "KAFKA_SASL_SSL_PORT or stop it"
            exit 1
        fi
    done

    ensure_jars
    ensure_tls
    write_config
    format_if_needed
    warn_if_crowded

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
    ensure_scram_users || true
    show_listeners
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
        echo "running (pid $(read_pid), 127.0.0.1:$KAFKA_PORT, SASL_PLAINTEXT 127.0.0.1:$KAFKA_SASL_PORT, SASL_SSL 127.0.0.1:$KAFKA_SASL_SSL_PORT, data $DATA_DIR)"
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

# Every test run makes topics of its own (about 6,000 partitions for `make test`); a broker kept across runs
# accumulates them until it runs out of open files (its log directory then fails: "Too many open files").
warn_if_crowded() {
    local dirs limit
    dirs=$(find "$LOG_DIRS" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)
    limit=$(ulimit -n)
    if [[ "$limit" != unlimited && "$dirs" -gt $((limit / 2)) ]]; then
        log "WARNING: $dirs topic partitions in $LOG_DIRS against $limit open files allowed: the broker may fail" \
            "with 'Too many open files'. They are earlier test runs' topics: scripts/broker.sh reset deletes them"
    fi
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
