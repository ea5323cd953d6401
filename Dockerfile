# syntax=docker/dockerfile:1
# retry-policy-webhook image: `retry-webhook` as ENTRYPOINT, non-root, no build tools.
#   docker build -t retry-policy-webhook:dev .
# The chart runs it with a read-only root filesystem: nothing here writes at run time
# (bytecode is compiled at build time; /tmp is an emptyDir in the pod).

ARG PYTHON_VERSION=3.12

# --- builder: wheels for the package and all its dependencies, and the compiled modules
FROM python:${PYTHON_VERSION}-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A C compiler for mypyc, which compiles the modules on every admission's path (about a
# third less time a policy run; README, Performance). The runtime stage gets none of it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# .dockerignore lets in only what the package build needs (pyproject, README, webhook/)
# and the compile script.
COPY . .
# The compiled modules are built in a second virtualenv holding the same package plus
# mypy (mypyc, which builds with setuptools: not in a Python 3.12 virtualenv), and copied
# into the runtime one, which never holds either. The build fails if the runtime
# virtualenv does not then run them.
RUN python -m pip wheel --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --find-links /wheels retry-policy-webhook \
 && python -m venv /opt/build \
 && /opt/build/bin/pip install --no-index --find-links /wheels retry-policy-webhook \
 && /opt/build/bin/pip install "mypy>=2.4,<3" setuptools \
 && /opt/build/bin/python .ci/compile-native --installed \
 && cp -r /opt/build/lib/python*/site-packages/webhook/_compiled \
          /opt/venv/lib/python*/site-packages/webhook/ \
 && /opt/venv/bin/pip uninstall --yes pip \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib \
 && /opt/venv/bin/python -c "import sys, webhook; sys.exit(webhook.NATIVE is None)" \
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
