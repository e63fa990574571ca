# vLLM engine image with the kvscope plugin installed (the compose profile engine-plugin and
# docker/k8s/examples/vllm-plugin use it). Build from the repository root:
#   docker build -f docker/engine.Dockerfile -t kvscope-vllm:0.1.0 .
# The base install (wire format + publisher + vLLM plugin entry points) is all an engine
# needs; kvscope stays off until KVSCOPE_BOOTSTRAP_SERVERS is set. The vLLM tag matches the
# vLLM version kvscope's tests run (pyproject.toml, extra "vllm"); a test checks it.
# Not built here (no Docker engine on the machines kvscope is developed on).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

COPY pyproject.toml README.md /opt/kvscope/
COPY schemas /opt/kvscope/schemas
COPY common /opt/kvscope/common
COPY publisher /opt/kvscope/publisher
COPY cachemodel /opt/kvscope/cachemodel
COPY simulator /opt/kvscope/simulator
COPY collector /opt/kvscope/collector
COPY analytics /opt/kvscope/analytics
COPY serve /opt/kvscope/serve
COPY local /opt/kvscope/local
COPY index /opt/kvscope/index
COPY route /opt/kvscope/route
COPY web /opt/kvscope/web
COPY cli /opt/kvscope/cli
COPY consumer /opt/kvscope/consumer
COPY sql /opt/kvscope/sql
RUN pip install --no-cache-dir /opt/kvscope
