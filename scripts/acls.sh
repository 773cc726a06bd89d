#!/usr/bin/env bash
# The topic ACLs of docs/security.md ("Topic ACLs"), applied with Kafka's own
# AclCommand (scripts/kafka-tool acls). Idempotent: adding an ACL that exists
# is a no-op. Three principals:
#
#   WORKER    the workers of one app id: every topic they read and write
#   PRODUCER  an application that submits tasks and jobs and reads results
#   OPERATOR  a person's CLI: approval decisions, dead letters, requeue, job cancel
#
# Nothing else may write agent.circuits, agent.outcomes.*, agent.answers.*,
# agent.job.events, agent.control, agent.results or a dead-letter topic.
#
# Usage: scripts/acls.sh [--print]     (--print: show the commands, run none)
#
# Environment (defaults for the local broker of scripts/broker.sh, started with KAFKA_ACLS=1):
#   ACL_BOOTSTRAP        broker to send the commands to  (default 127.0.0.1:$KAFKA_PORT, PLAINTEXT)
#   ACL_COMMAND_CONFIG   client properties of an admin principal (default none: the
#                        local broker's PLAINTEXT listener is a super user)
#   APP_ID               the workers' AGENTS_STREAM_APP_ID (default agents-stream)
#   AGENTS               the agents, space-separated       (default "analyzer summarizer")
#   WORKER, PRODUCER, OPERATOR   user names               (default agents, producer, operator)
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BOOTSTRAP="${ACL_BOOTSTRAP:-127.0.0.1:${KAFKA_PORT:-9092}}"
APP_ID="${APP_ID:-agents-stream}"
read -r -a AGENT_LIST <<<"${AGENTS:-analyzer summarizer}"
WORKER="${WORKER:-agents}"
PRODUCER="${PRODUCER:-producer}"
OPERATOR="${OPERATOR:-operator}"
PRINT=""
[[ "${1:-}" == "--print" ]] && PRINT=yes

CONNECT=(--bootstrap-server "$BOOTSTRAP")
[[ -n "${ACL_COMMAND_CONFIG:-}" ]] && CONNECT+=(--command-config "$ACL_COMMAND_CONFIG")

# One AclCommand run: "allow PRINCIPAL OPERATIONS -- RESOURCE ARGS".
allow() {
    local principal="$1"; shift
    local args=(--add --allow-principal "User:$principal")
    while [[ "$1" != "--" ]]; do args+=(--operation "$1"); shift; done
    shift
    args+=("$@")
    if [[ -n "$PRINT" ]]; then
        echo "scripts/kafka-tool acls --bootstrap-server $BOOTSTRAP ${args[*]}"
    else
        local out
        if ! out="$(timeout 120 "$SCRIPT_DIR/kafka-tool" acls "${CONNECT[@]}" "${args[@]}" 2>&1)"; then
            echo "$out" >&2
            echo "acls.sh: could not add the ACLs of User:$principal on $BOOTSTRAP (AclCommand's output above)." \
                "Is the broker up with an authorizer (scripts/broker.sh: KAFKA_ACLS=1)?" >&2
            exit 1
        fi
    fi
}

topics() { local t; for t in "$@"; do printf -- '--topic %s ' "$t"; done; }

task_topics=() dlq_topics=()
for agent in "${AGENT_LIST[@]}"; do
    task_topics+=("agent.tasks.$agent")
    dlq_topics+=("agent.tasks.$agent.dlq")
done

# shellcheck disable=SC2046  # topics prints words on purpose
{
    # Worker: its app id's outcomes and answers, the shared topics, every agent's tasks and dead letters (the
    # orchestrator sends to any agent; the web requeues), its tables' changelogs (<app id>-...), its group.
    allow "$WORKER" Read Write Create Describe DescribeConfigs -- $(topics \
        "agent.outcomes.$APP_ID" "agent.answers.$APP_ID" agent.results agent.replies agent.conversation.events \
        agent.control agent.circuits \
        agent.approvals agent.approvals.dlq agent.jobs agent.jobs.dlq agent.job.events agent.job.results)
    allow "$WORKER" Read Write Create Describe DescribeConfigs -- --resource-pattern-type prefixed \
        $(topics agent.tasks. "$APP_ID-")
    allow "$WORKER" Read Describe -- --group "$APP_ID"
    # The start-up check that the broker's message size fits the payload limit reads the broker's config.
    allow "$WORKER" DescribeConfigs -- --cluster

    # Producer: writes its agents' task topics (tasks and conversation messages) and agent.jobs, reads the results
    # and replies with groups named <producer>-...
    allow "$PRODUCER" Write Describe -- $(topics "${task_topics[@]}" agent.jobs)
    allow "$PRODUCER" Read Describe -- $(topics agent.results agent.replies agent.job.results)
    allow "$PRODUCER" Read Describe -- --resource-pattern-type prefixed --group "$PRODUCER-"

    # Operator: approval decisions and job cancels; reads dead letters, results and control events (alerts);
    # requeues to a task topic.
    allow "$OPERATOR" Write Describe -- $(topics agent.approvals agent.jobs "${task_topics[@]}")
    allow "$OPERATOR" Read Describe -- $(topics "${dlq_topics[@]}" agent.approvals.dlq agent.jobs.dlq agent.results \
        agent.job.results agent.control)
}
[[ -n "$PRINT" ]] || echo "acls.sh: ACLs for User:$WORKER (app id $APP_ID), User:$PRODUCER, User:$OPERATOR" \
    "(agents: ${AGENT_LIST[*]}) added on $BOOTSTRAP" >&2
