"""kvstack as a Gateway API Inference Extension endpoint picker (EPP), over Envoy's ext_proc.

An Envoy-based gateway (kgateway, Istio, Envoy Gateway, GKE) carries the bytes; for each
request it asks this ext_proc gRPC service where to send it, and the router's own scheduling
code answers: the same filters, scorers, cost model, prefix state (KV events, index credit),
LoRA affinity and adapter control plane, admission and shedding — one brain, no fork.

The protocol followed is GIE's Endpoint Picker Protocol v1.0.0 as documented by GIE v1.6.0
(``kubernetes-sigs/gateway-api-inference-extension``, ``docs/proposals/004-endpoint-picker-
protocol/README.md``): destination in the ``x-gateway-destination-endpoint`` header and in
``envoy.lb`` dynamic metadata, the ``envoy.lb.subset_hint`` subset, 429 for shed requests,
503 when no endpoint is ready, the gRPC health services. Resources: ``InferencePool``
``inference.networking.k8s.io/v1``; ``InferenceObjective`` ``inference.networking.x-k8s.io/
v1alpha2`` (GIE v1.3; since moved with the EPP to llm-d); the older ``InferenceModel``
``v1alpha2`` (GIE v0.5). GIE's Go EPP (``pkg/epp/handlers``) was read for the message order
in full-duplex mode; this code is kvstack's own.

- ``config``: the ``epp`` section (listener, TLS, body modes, the pool).
- ``protocol``: the protocol's keys and the ext_proc messages built from them.
- ``picker``: ``EndpointPicker`` — the router's decision for one request, as a placement.
- ``stream``: ``ExtProcStream`` — one request's messages in buffered and full-duplex modes.
- ``server``: ``EppServer`` — grpc.aio, health, TLS, token auth.
- ``tls``: server credentials, self-signed as GIE does.
- ``kube``: ``ResourceWatch`` — custom resources listed and watched as snapshots.
- ``pool``: ``InferencePoolDiscovery`` — the pool's pods as the router's backends.
- ``objectives``: ``ObjectiveBook`` — InferenceObjective / InferenceModel → priorities, routes.
- ``build``: ``build_epp`` — the parts from config.
- ``cli``: ``kvstack epp``.
"""
