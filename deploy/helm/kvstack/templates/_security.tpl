{{/*
Secrets the components need, and where each comes from: a Secret the values name, or else one
the chart generates (random, never a value, kept across upgrades and uninstalls). Each helper
returns {name, key} as JSON, or "" when the secret is not used:
  $s := include "kvstack.clusterSecret" . | fromJson
*/}}

{{/* The cluster secret: every component (router, index, engines) reads it. */}}
{{- define "kvstack.clusterSecret" -}}
{{- $s := .Values.security.clusterSecret -}}
{{- dict "name" (default (include "kvstack.componentName" (dict "root" . "suffix" "cluster-secret")) $s.name) "key" $s.key "generated" (not $s.name) | toJson -}}
{{- end -}}

{{/* The router's API keys file ("KEY [TENANT]" lines); "" when router auth is off. */}}
{{- define "kvstack.apiKeysSecret" -}}
{{- $r := .Values.router -}}
{{- if $r.auth.enabled -}}
{{- dict "name" (default (include "kvstack.componentName" (dict "root" . "suffix" "api-keys")) $r.apiKeysSecret.name) "key" $r.apiKeysSecret.key "generated" (not $r.apiKeysSecret.name) | toJson -}}
{{- end -}}
{{- end -}}

{{/* True when some engine serves LoRA adapters (vLLM's adapter endpoints are then on). */}}
{{- define "kvstack.anyLora" -}}
{{- $any := false -}}
{{- range $m := .Values.models -}}
{{- $e := include "kvstack.engineSpec" (dict "root" $ "m" $m) | fromYaml -}}
{{- if $e.lora.enabled }}{{ $any = true }}{{ end -}}
{{- end -}}
{{- if $any }}true{{ end -}}
{{- end -}}

{{/* vLLM's API key (VLLM_API_KEY on every engine, the router's upstream key): the named
Secret, or one the chart generates whenever LoRA is enabled, so that only the router reaches
/v1/load_lora_adapter; "" otherwise. */}}
{{- define "kvstack.engineKeySecret" -}}
{{- $k := .Values.engine.apiKeySecret -}}
{{- if $k.name -}}
{{- dict "name" $k.name "key" $k.key "generated" false | toJson -}}
{{- else if include "kvstack.anyLora" . -}}
{{- dict "name" (include "kvstack.componentName" (dict "root" . "suffix" "engine-api-key")) "key" $k.key "generated" true | toJson -}}
{{- end -}}
{{- end -}}

{{/* The Valkey/Redis password: the named Secret, or for the internal Valkey one the chart
generates; "" for an external server without one. */}}
{{- define "kvstack.redisPasswordSecret" -}}
{{- $r := .Values.redis -}}
{{- if eq $r.mode "none" -}}
{{- else if $r.passwordSecret.name -}}
{{- dict "name" $r.passwordSecret.name "key" $r.passwordSecret.key "generated" false | toJson -}}
{{- else if eq $r.mode "internal" -}}
{{- dict "name" (include "kvstack.componentName" (dict "root" . "suffix" "redis-password")) "key" $r.passwordSecret.key "generated" true | toJson -}}
{{- end -}}
{{- end -}}

{{/* A generated Secret: (dict "root" $ "secret" {name, key} "component" C "value" V). The
value already in the cluster is kept (lookup), so upgrades never rotate it by surprise. */}}
{{- define "kvstack.generatedSecret" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .secret.name -}}
{{- $data := dict -}}
{{- if and $existing $existing.data (hasKey $existing.data .secret.key) -}}
{{- $data = dict .secret.key (index $existing.data .secret.key) -}}
{{- else -}}
{{- $data = dict .secret.key (.value | b64enc) -}}
{{- end }}
---
apiVersion: v1
kind: Secret
metadata:
  name: {{ .secret.name }}
  labels:
    {{- include "kvstack.labels" (dict "root" .root "component" .component) | nindent 4 }}
  annotations:
    helm.sh/resource-policy: keep  # generated once; an uninstall must not lose it
type: Opaque
data:
  {{- toYaml $data | nindent 2 }}
{{- end -}}

{{/* The cluster secret as a read-only volume and the variable that points at it. */}}
{{- define "kvstack.clusterSecretVolume" -}}
{{- $s := include "kvstack.clusterSecret" . | fromJson -}}
- name: cluster-secret
  secret:
    secretName: {{ $s.name }}
    defaultMode: 0440  # group: the pod's fsGroup (a non-root process reads it)
    items: [{key: {{ $s.key }}, path: {{ $s.key }}}]
{{- end -}}

{{- define "kvstack.clusterSecretMount" -}}
- {name: cluster-secret, mountPath: /etc/kvstack/cluster-secret, readOnly: true}
{{- end -}}

{{- define "kvstack.clusterSecretEnv" -}}
{{- $s := include "kvstack.clusterSecret" . | fromJson -}}
- name: KVSTACK_SECURITY_CLUSTER_SECRET_FILE
  value: {{ printf "/etc/kvstack/cluster-secret/%s" $s.key | quote }}
{{- end -}}

{{/* Container hardening every kvstack container shares. */}}
{{- define "kvstack.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
  seccompProfile: {type: RuntimeDefault}
{{- end -}}
