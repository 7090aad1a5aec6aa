# ttcore: CPU image. Default command: the Ray Serve application (Ray head + Serve);
# TTCORE_MODE=embedded runs the same app under plain uvicorn; TTCORE_MODE=worker joins a Ray head.
#   docker build -t ttcore .                       (GPU: --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128)
#   docker run -p 8000:8000 --shm-size=2g ttcore
# Without a registry (Debian's Python as the base, a local torch wheel, a CA bundle for a TLS-intercepting
# proxy as a BuildKit secret): deploy/local-images.sh.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first and pinned (as dev.sh does): an unpinned torch would pull a multi-GB CUDA build. A torch wheel
# in deploy/wheelhouse/ is used instead of the index. The secret pip_ca (optional) is the CA bundle pip trusts.
COPY deploy/wheelhouse /wheelhouse
RUN --mount=type=secret,id=pip_ca \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi; \
    if ls /wheelhouse/torch-*.whl >/dev/null 2>&1; then \
      pip install /wheelhouse/torch-"${TORCH_VERSION}"*.whl; \
    else pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"; fi
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ttcore ttcore
COPY service service
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pip_ca \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi; \
    pip install ".[chem,serve,text]"  # the project itself; its dependency ranges live in pyproject.toml

FROM ${PYTHON_IMAGE}
# RDKit's wheel links libXrender and libXext (without them every SMILES answer says valid=null)
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends libxrender1 libxext6 \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 ttcore && install -d -o ttcore -g ttcore -m 700 /home/ttcore/ray-auth
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY --chown=ttcore:ttcore checkpoints checkpoints
COPY --chown=ttcore:ttcore deploy deploy
# Serve kills an HTTP proxy not ready within 5 s; a busy or small node can take longer to start one
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TTCORE_MODE=ray \
    TTCORE_CHECKPOINTS=/app/checkpoints \
    PORT=8000 \
    RAY_AUTH_MODE=token \
    RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S=60
USER 1000
EXPOSE 8000 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=90s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '8000'), timeout=4)"]
# deploy/local-images.sh removes the ttcore image a rebuild replaces (untagged) by this label
LABEL org.opencontainers.image.title="ttcore"
ENTRYPOINT ["sh", "deploy/entrypoint.sh"]
