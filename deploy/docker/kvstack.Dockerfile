# The kvstack image: router (with the LoRA control plane) and the cluster KV index service.
#   docker build -f deploy/docker/kvstack.Dockerfile -t REGISTRY/kvstack/kvstack:0.1.0 .
FROM python:3.11-slim

COPY pyproject.toml README.md /src/
COPY src /src/src
RUN pip install --no-cache-dir "/src[server,k8s,lora,postgres,s3]" \
 && rm -rf /src \
 && useradd --uid 10001 --create-home kvstack

USER 10001
ENTRYPOINT ["kvstack"]
CMD ["--help"]
