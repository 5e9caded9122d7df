{{/* Names, labels and images shared by every template. */}}

{{- define "kvstack.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvstack.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's resource name: <fullname>-<suffix>, at most 63 characters. */}}
{{- define "kvstack.componentName" -}}
{{- printf "%s-%s" (include "kvstack.fullname" .root) .suffix | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvstack.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvstack.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kvstack.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvstack.selectorLabels" . }}
app.kubernetes.io/part-of: kvstack
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/* The label selector the router's Kubernetes discovery uses: every engine of this release. */}}
{{- define "kvstack.engineSelector" -}}
app.kubernetes.io/name={{ include "kvstack.name" . }},app.kubernetes.io/instance={{ .Release.Name }},app.kubernetes.io/component=engine
{{- end -}}

{{- define "kvstack.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* The index backend: "valkey", "service", or "" (no index). */}}
{{- define "kvstack.indexBackend" -}}
{{- $i := .Values.index -}}
{{- if $i.enabled -}}
{{- if eq $i.backend "auto" -}}
{{- ternary "service" "valkey" (and (eq .Values.redis.mode "none") (not $i.valkey.url)) -}}
{{- else -}}
{{- $i.backend -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The secret holding the Valkey index's password: index.valkey's, else the tier Valkey's
(named or generated) when the index lives there, else redis.passwordSecret. */}}
{{- define "kvstack.indexPasswordSecret" -}}
{{- $v := .Values.index.valkey -}}
{{- if $v.passwordSecret.name -}}
{{- toYaml $v.passwordSecret -}}
{{- else if not $v.url -}}
{{- /* the tier's Valkey: its named or generated password */ -}}
{{- with include "kvstack.redisPasswordSecret" . }}{{ toYaml (fromJson .) }}{{ end -}}
{{- else -}}
{{- toYaml .Values.redis.passwordSecret -}}
{{- end -}}
{{- end -}}

{{/* Environment for processes using the Valkey index: its password, from a Secret. */}}
{{- define "kvstack.indexEnv" -}}
{{- if eq (include "kvstack.indexBackend" .) "valkey" -}}
{{- $secret := include "kvstack.indexPasswordSecret" . | fromYaml -}}
{{- if $secret.name -}}
{{ include "kvstack.secretEnv" (dict "name" "VALKEY_INDEX_PASSWORD" "secret" $secret) }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The index URL engines and routers use: the index Service, or Valkey with the index's
parameters (the tier URL's own parameters, such as its prefix or chunk TTL, are not the
index's; a cluster stays a cluster). */}}
{{- define "kvstack.indexUrl" -}}
{{- $i := .Values.index -}}
{{- if eq (include "kvstack.indexBackend" .) "valkey" -}}
{{- $base := $i.valkey.url -}}
{{- if not $base -}}
{{- if eq .Values.redis.mode "internal" -}}
{{- $base = printf "redis://%s:6379/0" (include "kvstack.redisHost" .) -}}
{{- else if eq .Values.redis.mode "external" -}}
{{- $base = .Values.redis.url -}}
{{- else -}}
{{- fail "index.backend=valkey needs a Valkey: redis.mode internal or external, or index.valkey.url" -}}
{{- end -}}
{{- end -}}
{{- if contains "@" $base -}}
{{- fail "index.valkey.url must not carry credentials; put the password in the Secret named by index.valkey.passwordSecret" -}}
{{- end -}}
{{- $params := list (printf "prefix=%s" $i.valkey.prefix) -}}
{{- if contains "cluster=true" $base }}{{ $params = append $params "cluster=true" }}{{ end -}}
{{- with $i.valkey.params }}{{ $params = append $params . }}{{ end -}}
{{- if (include "kvstack.indexPasswordSecret" . | fromYaml).name -}}
{{- $params = append $params "password_env=VALKEY_INDEX_PASSWORD" -}}
{{- end -}}
{{- printf "%s?%s" (regexReplaceAll "\\?.*$" $base "") (join "&" $params) -}}
{{- else -}}
{{- printf "http://%s:%d" (include "kvstack.componentName" (dict "root" . "suffix" "index")) (int .Values.index.port) -}}
{{- end -}}
{{- end -}}

{{/* Whether the Valkey index lives on the chart's own Valkey (whose eviction it shapes). */}}
{{- define "kvstack.indexOnChartValkey" -}}
{{- if and (eq (include "kvstack.indexBackend" .) "valkey") (not .Values.index.valkey.url) (eq .Values.redis.mode "internal") -}}
true
{{- end -}}
{{- end -}}

{{- define "kvstack.redisHost" -}}
{{- include "kvstack.componentName" (dict "root" . "suffix" "redis") -}}
{{- end -}}

{{/* Pod annotations: Prometheus scrape hints for /metrics on `port`, then `extra`. */}}
{{- define "kvstack.podAnnotations" -}}
{{- $ann := dict -}}
{{- if .root.Values.metrics.scrapeAnnotations -}}
{{- $ann = dict "prometheus.io/scrape" "true" "prometheus.io/port" (toString .port) "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- $ann = mergeOverwrite $ann (deepCopy (default dict .extra)) -}}
{{- with .checksum }}{{ $_ := set $ann "checksum/config" . }}{{ end -}}
{{- if $ann -}}
annotations:
  {{- toYaml $ann | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* An env var read from a Secret: (dict "name" ENV "secret" {name, key}). */}}
{{- define "kvstack.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret.name }}
      key: {{ .secret.key }}
{{- end -}}

{{/* AWS credentials from a Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. */}}
{{- define "kvstack.awsEnv" -}}
{{- range $key := list "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" }}
- name: {{ $key }}
  valueFrom:
    secretKeyRef:
      name: {{ $.secret }}
      key: {{ $key }}
{{- end }}
{{- end -}}
