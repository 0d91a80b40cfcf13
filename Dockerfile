# Sidecar / gateway image for the Sluice proxy: `sluice serve` with the shipped filters.
#   docker build -t sluice .
#   docker run --rm -p 9092-9100:9092-9100 -v "$PWD/sluice.yaml:/etc/sluice/sluice.yaml:ro" sluice \
#       --listen 0.0.0.0:9092 --upstream kafka:9092 --config /etc/sluice/sluice.yaml
# See docs/DEPLOYMENT.md (Kubernetes sidecar and gateway examples).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SLUICE_LOG_FORMAT=json

WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY sluice ./sluice
COPY codec ./codec
COPY crypto ./crypto
COPY filters ./filters
COPY proxy ./proxy
COPY spark_audit ./spark_audit
COPY telemetry_schema ./telemetry_schema
COPY transforms ./transforms
# Pinned versions from constraints.txt; the proxy needs no extras (no Spark, no build tools).
RUN pip install --no-cache-dir -c constraints.txt . \
    && useradd --system --uid 10001 --no-create-home sluice

USER 10001
WORKDIR /
# 9092: bootstrap; 9093-9100: one port per broker node (or proxy.node_ports); 9464: metrics.
EXPOSE 9092 9464
ENTRYPOINT ["sluice", "serve"]
CMD ["--listen", "0.0.0.0:9092", "--upstream", "127.0.0.1:9094", "--config", "/etc/sluice/sluice.yaml"]
