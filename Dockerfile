# syntax=docker/dockerfile:1
# retry-policy-webhook image: `retry-webhook` as ENTRYPOINT, non-root, no build tools.
#   docker build -t retry-policy-webhook:dev .
# The chart runs it with a read-only root filesystem: nothing here writes at run time
# (bytecode is compiled at build time; /tmp is an emptyDir in the pod).

ARG PYTHON_VERSION=3.12

# --- builder: wheels for the package and all its dependencies -------------------
FROM python:${PYTHON_VERSION}-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# .dockerignore lets in only what the package build needs (pyproject, README, webhook/).
COPY . .
RUN python -m pip wheel --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --find-links /wheels retry-policy-webhook \
 && /opt/venv/bin/pip uninstall --yes pip \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib \
 && /opt/venv/bin/retry-webhook --help >/dev/null

# --- runtime: the same Python, the virtualenv, nothing else -----------------------
FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="retry-policy-webhook" \
      org.opencontainers.image.description="Kubernetes admission webhook for retry and failure policy of batch workloads" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=builder /opt/venv /opt/venv
# 65532: the conventional "nonroot" UID/GID; the chart sets the same in runAsUser.
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["retry-webhook"]
CMD ["--help"]
