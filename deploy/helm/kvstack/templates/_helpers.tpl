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

{{- define "kvstack.indexUrl" -}}
{{- printf "http://%s:%d" (include "kvstack.componentName" (dict "root" . "suffix" "index")) (int .Values.index.port) -}}
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
