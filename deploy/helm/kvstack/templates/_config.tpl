{{/*
The kvstack config file of the router pods (sections `router` and `lora`). Secrets never
appear here: they reach the process as KVSTACK_<SECTION>_<KEY> variables or mounted files.
*/}}

{{- define "kvstack.routerSection" -}}
{{- $r := .Values.router -}}
{{- if hasKey $r.extraConfig "auth" -}}
{{- fail "router.extraConfig.auth: API keys are secrets; use router.apiKeysSecret and engine.apiKeySecret" -}}
{{- end -}}
{{- $kube := dict "namespace" .Release.Namespace "label_selector" (include "kvstack.engineSelector" .) "port" (int .Values.engine.port) "role_label" "kvstack.io/role" -}}
{{- $section := dict "host" "0.0.0.0" "port" (int $r.port) "discovery" (dict "kind" "kubernetes" "kubernetes" $kube) "models" $r.models "model_aliases" $r.modelAliases "session_header" $r.sessionHeader -}}
{{- with $r.policy }}{{ $_ := set $section "policy" . }}{{ end -}}
{{- with $r.pipeline }}{{ $_ := set $section "pipeline" . }}{{ end -}}
{{- with $r.admission }}{{ $_ := set $section "admission" . }}{{ end -}}
{{- $prefix := dict -}}
{{- if .Values.index.enabled }}{{ $_ := set $prefix "index_url" (include "kvstack.indexUrl" .) }}{{ end -}}
{{- if .Values.engine.kvEvents.enabled -}}
{{- $_ := set $prefix "events" (dict "port" (int .Values.engine.kvEvents.port)) -}}
{{- end -}}
{{- with $r.tokenizers }}{{ $_ := set $prefix "tokenizers" . }}{{ end -}}
{{- if $prefix }}{{ $_ := set $section "prefix" $prefix }}{{ end -}}
{{- if $r.auth.enabled -}}
{{- $_ := set $section "auth" (dict "api_keys_file" (printf "/etc/kvstack/auth/%s" $r.apiKeysSecret.key)) -}}
{{- end -}}
{{- with $r.tenants }}{{ $_ := set $section "tenants" . }}{{ end -}}
{{- toYaml (mergeOverwrite $section (deepCopy $r.extraConfig)) -}}
{{- end -}}

{{- define "kvstack.loraSection" -}}
{{- $a := .Values.adapters -}}
{{- range $key := list "registry_url" "admin_key" -}}
{{- if hasKey $a.extraConfig $key -}}
{{- fail (printf "adapters.extraConfig.%s holds a secret; use the adapters.*Secret values" $key) -}}
{{- end -}}
{{- end -}}
{{- $section := dict -}}
{{- if eq $a.registry.type "sqlite" -}}
{{- $_ := set $section "registry_url" "sqlite:////var/lib/kvstack/lora/registry.db" -}}
{{- end -}}
{{- $_ := set $section "artifact_store" (default "file:///var/lib/kvstack/lora/artifacts" $a.artifactStore) -}}
{{- with $a.s3EndpointUrl }}{{ $_ := set $section "s3_endpoint_url" . }}{{ end -}}
{{- if $a.trustedKeysSecret.name -}}
{{- $keys := list -}}
{{- range $a.trustedKeysSecret.keys }}{{ $keys = append $keys (printf "/etc/kvstack/trusted-keys/%s" .) }}{{ end -}}
{{- $_ := set $section "trusted_keys" $keys -}}
{{- end -}}
{{- toYaml (mergeOverwrite $section (deepCopy $a.extraConfig)) -}}
{{- end -}}

{{- define "kvstack.routerConfig" -}}
router:
  {{- include "kvstack.routerSection" . | nindent 2 }}
{{- if .Values.adapters.enabled }}
lora:
  {{- include "kvstack.loraSection" . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Adapters: a sqlite registry lives on one PVC, so it allows exactly one router. */}}
{{- define "kvstack.checkRegistry" -}}
{{- $a := .Values.adapters -}}
{{- $r := .Values.router -}}
{{- if and $a.enabled (eq $a.registry.type "sqlite") -}}
{{- $most := ternary $r.autoscaling.maxReplicas $r.replicas $r.autoscaling.enabled -}}
{{- if gt (int $most) 1 -}}
{{- fail (printf "adapters.registry.type=sqlite allows one router replica (got up to %v); use postgresql with adapters.registry.urlSecret, or router.replicas=1 and router.autoscaling.enabled=false" $most) -}}
{{- end -}}
{{- end -}}
{{- if and $a.enabled (eq $a.registry.type "postgresql") (not $a.registry.urlSecret.name) -}}
{{- fail "adapters.registry.type=postgresql needs adapters.registry.urlSecret.name (a Secret holding the URL)" -}}
{{- end -}}
{{- end -}}

{{- define "kvstack.adaptersClaim" -}}
{{- default (include "kvstack.componentName" (dict "root" . "suffix" "adapters")) .Values.adapters.sharedVolume.existingClaim -}}
{{- end -}}
