{{/* Names and labels, as `helm create` makes them. */}}
{{- define "agents-stream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "agents-stream.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "agents-stream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agents-stream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "agents-stream.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agents-stream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "agents-stream.configMapName" -}}
{{- .Values.config.existingConfigMap | default (printf "%s-config" (include "agents-stream.fullname" .)) }}
{{- end }}

{{- define "agents-stream.secretName" -}}
{{- printf "%s-env" (include "agents-stream.fullname" .) }}
{{- end }}

{{/* KAFKA_BROKER in Faust's form (kafka://a:9092,kafka://b:9092) as KEDA's bootstrapServers (a:9092,b:9092), the
way agents_stream.settings.bootstrap_servers reads it. */}}
{{- define "agents-stream.bootstrapServers" -}}
{{- $servers := list }}
{{- range splitList "," .Values.kafka.broker }}
{{- $part := trim . }}
{{- if $part }}
{{- $servers = append $servers (regexReplaceAll "^[a-zA-Z][a-zA-Z0-9+.-]*://" $part "") }}
{{- end }}
{{- end }}
{{- join "," $servers }}
{{- end }}

{{/* The environment names the chart sets itself, and the value each comes from: refused in .Values.env, where a
second definition would silently win over the value the chart's bounds were checked against. */}}
{{- define "agents-stream.ownEnv" -}}
KAFKA_BROKER: kafka.broker
AGENTS_STREAM_APP_ID: kafka.appId
AGENTS_STREAM_PARTITIONS: kafka.partitions
AGENTS_STREAM_SHUTDOWN_GRACE_S: shutdownGraceSeconds
AGENTS_STREAM_INSTANCE_ID: the pod's name (staticMembership)
AGENTS_STREAM_DATA_DIR: the volume's mount path (/data)
AGENTS_STREAM_CONFIG: the ConfigMap's mount path (config)
AGENTS_STREAM_PUBLIC_URL: web.publicUrl
AGENTS_STREAM_WEB_ALLOWED_HOSTS: web.allowedHosts
WEB_PORT: web.port
WEB_HOST: the pod's IP
WEB_BIND: 0.0.0.0, every interface
{{- end }}

{{/* Values that contradict each other fail the render, saying what to change. */}}
{{- define "agents-stream.validate" -}}
{{- $partitions := int .Values.kafka.partitions }}
{{- if gt (int .Values.replicaCount) $partitions }}
{{- fail (printf "replicaCount (%d) is more than kafka.partitions (%d): a worker beyond the partition count gets no partition and sits idle. Lower replicaCount or raise kafka.partitions (AGENTS_STREAM_PARTITIONS; topics that exist keep their count)." (int .Values.replicaCount) $partitions) }}
{{- end }}
{{- if .Values.keda.enabled }}
{{- if gt (int .Values.keda.maxReplicaCount) $partitions }}
{{- fail (printf "keda.maxReplicaCount (%d) is more than kafka.partitions (%d): KEDA would add workers that get no partition. Lower keda.maxReplicaCount or raise kafka.partitions." (int .Values.keda.maxReplicaCount) $partitions) }}
{{- end }}
{{- if gt (int .Values.keda.minReplicaCount) (int .Values.keda.maxReplicaCount) }}
{{- fail (printf "keda.minReplicaCount (%d) is more than keda.maxReplicaCount (%d)." (int .Values.keda.minReplicaCount) (int .Values.keda.maxReplicaCount)) }}
{{- end }}
{{- end }}
{{- $needed := addf (float64 .Values.shutdownGraceSeconds) 15 }}
{{- if lt (float64 .Values.terminationGracePeriodSeconds) $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%v) is shorter than shutdownGraceSeconds (%v) + 15 s (results confirmed, then the final commit): the kubelet would SIGKILL workers mid-shutdown. Raise terminationGracePeriodSeconds to at least %v." .Values.terminationGracePeriodSeconds .Values.shutdownGraceSeconds $needed) }}
{{- end }}
{{- $own := include "agents-stream.ownEnv" . | fromYaml }}
{{- range $name, $_ := .Values.env }}
{{- if hasKey $own $name }}
{{- fail (printf "env.%s is set by the chart (%s): leave it out of env (docs/guide/kubernetes.md, \"Keys and tokens\")." $name (get $own $name)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* AGENTS_STREAM_WEB_ALLOWED_HOSTS: the Service's names (any port) and web.allowedHosts. The pod's own
WEB_HOST:WEB_PORT is always allowed; the probes and the scrape answer any Host. */}}
{{- define "agents-stream.allowedHosts" -}}
{{- $svc := include "agents-stream.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- join "," (concat $names .Values.web.allowedHosts) }}
{{- end }}
