{{/*
Engine helpers. A model entry is merged over `engine` (and its `kv` over `kv`) into one spec:
  $e := include "kvstack.engineSpec" (dict "root" $ "m" $m) | fromYaml
*/}}

{{- define "kvstack.engineSpec" -}}
{{- $root := .root -}}
{{- $m := .m -}}
{{- $e := mergeOverwrite (deepCopy $root.Values.engine) (omit $m "name" "model" "servedModelName" "replicas" "role" "kv") -}}
{{- $kv := mergeOverwrite (deepCopy $root.Values.kv) (deepCopy (default dict $m.kv)) -}}
{{- $fullname := include "kvstack.componentName" (dict "root" $root "suffix" $m.name) -}}
{{- $_ := set $e "name" $m.name -}}
{{- $_ = set $e "deployment" $fullname -}}
{{- $_ = set $e "model" $m.model -}}
{{- $_ = set $e "servedModelName" (default $m.name $m.servedModelName) -}}
{{- $_ = set $e "replicas" (default 1 $m.replicas) -}}
{{- $_ = set $e "role" (default "both" $m.role) -}}
{{- $_ = set $e "kv" $kv -}}
{{- $_ = set $e "port" $root.Values.engine.port -}}
{{- $_ = set $e "apiKeySecret" $root.Values.engine.apiKeySecret -}}
{{- /* The router subscribes to one events port on every engine. */ -}}
{{- $_ = set $e.kvEvents "port" $root.Values.engine.kvEvents.port -}}
{{- /* How this engine is named to the index and its peers: the router's host:port of it. */ -}}
{{- $_ = set $e "instanceId" (printf "$(POD_IP):%v" $root.Values.engine.port) -}}
{{- toYaml $e -}}
{{- end -}}

{{/* Tier URLs, fastest first, as a YAML list. */}}
{{- define "kvstack.kvTiers" -}}
{{- $root := .root -}}
{{- $kv := .e.kv -}}
{{- $tiers := list -}}
{{- if $kv.cpu.size -}}
{{- $tiers = append $tiers (printf "cpu://?size=%s" $kv.cpu.size) -}}
{{- end -}}
{{- if $kv.disk.size -}}
{{- $tiers = append $tiers (printf "file://%s?size=%s" $kv.disk.path $kv.disk.size) -}}
{{- end -}}
{{- if $kv.peer.enabled -}}
{{- if not $root.Values.index.enabled -}}
{{- fail "kv.peer.enabled needs index.enabled: peers find each other's chunks through the index" -}}
{{- end -}}
{{- $tiers = append $tiers (printf "peer://?index=%s&self=%s" (include "kvstack.indexUrl" $root | urlquery) .e.instanceId) -}}
{{- end -}}
{{- $redis := include "kvstack.redisTierUrl" $root -}}
{{- if and $kv.redis $redis -}}
{{- $tiers = append $tiers $redis -}}
{{- end -}}
{{- if $kv.s3.enabled -}}
{{- $tiers = append $tiers (include "kvstack.s3TierUrl" $kv.s3) -}}
{{- end -}}
{{- $tiers = concat $tiers $kv.extraTiers -}}
{{- if not $tiers -}}
{{- fail (printf "model %s: kv.enabled but no tier is configured (kv.cpu.size, kv.disk.size...)" .e.name) -}}
{{- end -}}
{{- toYaml $tiers -}}
{{- end -}}

{{- define "kvstack.redisTierUrl" -}}
{{- $r := .Values.redis -}}
{{- $url := "" -}}
{{- if eq $r.mode "internal" -}}
{{- $url = printf "redis://%s:6379/0" (include "kvstack.redisHost" .) -}}
{{- else if eq $r.mode "external" -}}
{{- if not $r.url -}}
{{- fail "redis.mode=external needs redis.url (redis://host:6379/0)" -}}
{{- end -}}
{{- if contains "@" $r.url -}}
{{- fail "redis.url must not carry credentials; put the password in the Secret named by redis.passwordSecret" -}}
{{- end -}}
{{- $url = $r.url -}}
{{- end -}}
{{- if and $url (include "kvstack.redisPasswordSecret" .) -}}
{{- $url = printf "%s%spassword_env=KVSTACK_REDIS_PASSWORD" $url (ternary "&" "?" (contains "?" $url)) -}}
{{- end -}}
{{- if and $url (include "kvstack.indexOnChartValkey" .) (gt (int $r.chunkTtlS) 0) -}}
{{- $url = printf "%s%sttl_s=%d" $url (ternary "&" "?" (contains "?" $url)) (int $r.chunkTtlS) -}}
{{- end -}}
{{- $url -}}
{{- end -}}

{{- define "kvstack.s3TierUrl" -}}
{{- if not .bucket -}}
{{- fail "kv.s3.enabled needs kv.s3.bucket" -}}
{{- end -}}
{{- $params := list -}}
{{- if .endpointUrl }}{{ $params = append $params (printf "endpoint_url=%s" .endpointUrl) }}{{ end -}}
{{- if .region }}{{ $params = append $params (printf "region=%s" .region) }}{{ end -}}
{{- printf "s3://%s/%s" .bucket .prefix | trimSuffix "/" -}}
{{- if $params }}?{{ join "&" $params }}{{ end -}}
{{- end -}}

{{/* The --kv-transfer-config value (JSON) that loads KVStackConnector. */}}
{{- define "kvstack.kvTransferConfig" -}}
{{- $kv := .e.kv -}}
{{- $roles := dict "both" "kv_both" "prefill" "kv_producer" "decode" "kv_consumer" -}}
{{- if and .e.blockSize (ne (mod (int $kv.chunkSize) (int .e.blockSize)) 0) -}}
{{- fail (printf "model %s: kv.chunkSize %v is not a multiple of blockSize %v" .e.name $kv.chunkSize .e.blockSize) -}}
{{- end -}}
{{- $extra := dict "tiers" (include "kvstack.kvTiers" . | fromYamlArray) "chunk_size" (int $kv.chunkSize) -}}
{{- if $kv.modelFingerprint -}}
{{- $_ := set $extra "model_fingerprint" $kv.modelFingerprint -}}
{{- end -}}
{{- $extra = mergeOverwrite $extra (deepCopy $kv.extraConfig) -}}
{{- /* engine_id names the engine in the index (announce) and to its peers (peer:// self). */ -}}
{{- dict "kv_connector" "KVStackConnector" "kv_connector_module_path" "kvstack.integrations.vllm" "kv_role" (get $roles .e.role) "engine_id" .e.instanceId "kv_connector_extra_config" $extra | toJson -}}
{{- end -}}

{{- define "kvstack.kvEventsConfig" -}}
{{- dict "enable_kv_cache_events" true "publisher" "zmq" "endpoint" (printf "tcp://*:%d" (int .kvEvents.port)) | toJson -}}
{{- end -}}

{{/* vLLM's command line for one engine spec. */}}
{{- define "kvstack.engineArgs" -}}
{{- $e := .e -}}
- --model
- {{ $e.model | quote }}
- --served-model-name
- {{ $e.servedModelName | quote }}
- --host
- "0.0.0.0"
- --port
- {{ $e.port | quote }}
- --tensor-parallel-size
- {{ max 1 (int (default $e.gpus $e.tensorParallelSize)) | quote }}
- --gpu-memory-utilization
- {{ $e.gpuMemoryUtilization | quote }}
{{- with $e.maxModelLen }}
- --max-model-len
- {{ . | quote }}
{{- end }}
{{- with $e.blockSize }}
- --block-size
- {{ . | quote }}
{{- end }}
{{- if $e.kv.enabled }}
- --kv-transfer-config
- {{ include "kvstack.kvTransferConfig" . | quote }}
{{- /* Drain on SIGTERM instead of vLLM's abort, which kills the worker before the connector's
queued chunk writes land; the pod's grace period (120 s) covers both waits. */}}
- --shutdown-timeout
- "60"
{{- end }}
{{- if $e.kvEvents.enabled }}
- --kv-events-config
- {{ include "kvstack.kvEventsConfig" $e | quote }}
- --prefix-caching-hash-algo
- sha256_cbor
{{- end }}
{{- if $e.lora.enabled }}
- --enable-lora
- --max-loras
- {{ $e.lora.maxLoras | quote }}
- --max-cpu-loras
- {{ $e.lora.maxCpuLoras | quote }}
- --max-lora-rank
- {{ $e.lora.maxLoraRank | quote }}
{{- end }}
{{- range $e.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
