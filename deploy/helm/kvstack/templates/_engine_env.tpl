{{/* Environment of an engine container: identity, secrets, and the kvstack `index` section. */}}
{{- define "kvstack.engineEnv" -}}
{{- $root := .root -}}
{{- $e := .e -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: VLLM_NO_USAGE_STATS
  value: "1"
{{- if $e.weights.enabled }}
- name: HF_HOME
  value: {{ printf "%s/.hf-cache" $e.weights.mountPath | quote }}
{{- end }}
{{- if $e.hfTokenSecret.name }}
{{ include "kvstack.secretEnv" (dict "name" "HF_TOKEN" "secret" $e.hfTokenSecret) }}
{{- end }}
- name: HOME  # writable for the non-root user whatever the image (caches under ~/.cache)
  value: /home/vllm
{{ include "kvstack.clusterSecretEnv" $root }}
{{- with include "kvstack.engineKeySecret" $root }}
{{ include "kvstack.secretEnv" (dict "name" "VLLM_API_KEY" "secret" (fromJson .)) }}
{{- end }}
{{- if $e.lora.enabled }}
{{- /* Runtime load/unload endpoints; the NetworkPolicy lets only the router reach them. */}}
- name: VLLM_ALLOW_RUNTIME_LORA_UPDATING
  value: "True"
{{- end }}
{{- if $e.kv.enabled }}
- name: VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS  # the connector's flush of queued writes at exit
  value: "30"
{{- $redisPassword := include "kvstack.redisPasswordSecret" $root }}
{{- if and $e.kv.redis $redisPassword }}
{{ include "kvstack.secretEnv" (dict "name" "KVSTACK_REDIS_PASSWORD" "secret" (fromJson $redisPassword)) }}
{{- end }}
{{- if and $e.kv.s3.enabled $e.kv.s3.existingSecret }}
{{ include "kvstack.awsEnv" (dict "secret" $e.kv.s3.existingSecret) }}
{{- end }}
{{- if $root.Values.index.enabled }}
{{- with include "kvstack.indexEnv" $root }}
{{ . }}
{{- end }}
- name: KVSTACK_INDEX_ANNOUNCE__INDEX_URL
  value: {{ include "kvstack.indexUrl" $root | quote }}
- name: KVSTACK_INDEX_ANNOUNCE__INSTANCE_ID
  value: {{ $e.instanceId | quote }}
- name: KVSTACK_INDEX_ANNOUNCE__SERVED_MODEL_NAMES
  value: {{ list $e.servedModelName | toJson | quote }}
{{- end }}
{{- if $e.kv.peer.enabled }}
- name: KVSTACK_INDEX_PEER__ENABLED
  value: "true"
- name: KVSTACK_INDEX_PEER__PORT
  value: {{ $e.kv.peer.port | quote }}
- name: KVSTACK_INDEX_ANNOUNCE__PEER_ADDRESS
  value: {{ printf "$(POD_IP):%v" $e.kv.peer.port | quote }}
{{- end }}
{{- end }}
{{- with $e.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}
