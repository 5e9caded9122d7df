"""Several router replicas in front of one fleet, clients spread over them as a Kubernetes
Service spreads them (``kvstack bench routers``): what each replica knowing only its own soft
state costs in prefix hits and goodput, against a single router."""
