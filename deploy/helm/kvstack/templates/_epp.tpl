{{/*
The endpoint picker (epp.enabled): kvstack's router brain behind a Gateway API Inference
Extension gateway. Its config file holds the `router` section (the same as the router's: the
pipeline, admission, prefix state; its pod discovery is replaced by the InferencePool's), the
`epp` section and `security`.
*/}}

{{- define "kvstack.eppName" -}}
{{- include "kvstack.componentName" (dict "root" . "suffix" "epp") -}}
{{- end -}}

{{- define "kvstack.poolName" -}}
{{- default (include "kvstack.componentName" (dict "root" . "suffix" "pool")) .Values.epp.poolName -}}
{{- end -}}

{{- define "kvstack.eppConfig" -}}
{{- $p := .Values.epp -}}
{{- $tls := dict "self_signed" true -}}
{{- if $p.tls.existingSecret -}}
{{- $tls = dict "cert_file" "/etc/kvstack/tls/tls.crt" "key_file" "/etc/kvstack/tls/tls.key" -}}
{{- end -}}
{{- $pool := dict "name" (include "kvstack.poolName" .) "namespace" .Release.Namespace "objectives" $p.objectives "inference_models" $p.inferenceModels -}}
{{- $epp := dict "host" "0.0.0.0" "port" (int $p.port) "health_port" (int $p.healthPort) "metrics_port" (int $p.metricsPort) "tls" $tls "pool" $pool -}}
router:
  {{- include "kvstack.routerSection" . | nindent 2 }}
epp:
  {{- toYaml (mergeOverwrite $epp (deepCopy $p.extraConfig)) | nindent 2 }}
# The gateway's ext_proc client sends no credentials: the port is reached only through the
# NetworkPolicy below (epp.gatewayFrom), and the process logs a warning at every start.
security:
  insecure_no_auth: true
{{- end -}}
