"""The asyncrl pipeline: setup, then the four long-lived roles side by side, and finalize on exit.

    asyncrl pipeline compile            # writes asyncrl/cluster/pipeline/asyncrl.yaml (committed; a test checks it is current)

Parameters (the KFP UI's run form; each described by the pipeline function's docstring `Args:`): the config
fields are optional without a default (left empty, the configuration's value stands), the pod-shaping ones are
authoritative, the image defaults come from `asyncrl pipeline compile --registry R --tag T` (the committed YAML:
no registry, tag dev). The one precedence rule is `asyncrl.cluster.setup_config`'s; see docs/pipeline_form.md.

Graph: `finalize` is the `dsl.ExitHandler` exit task around everything, so it runs whether the run succeeded,
failed or was cancelled: it writes the `done` marker (every role exits by itself, so no GPU stays held), records
the final status and registers the final model in MLflow. Inside: `setup` validates the configuration and writes it
to S3 under the KFP run id (or, with `resume_run_id`, checks and rewinds that crashed run: see
`asyncrl.run.resume`) and outputs the run id; every role reads it from setup's output `run_id` (a
taskOutputParameter), so a resumed pipeline run drives the old run's S3 folder; the roles depend on setup only
(they read that document), never on each other, so Argo runs them concurrently; they find each other through S3
rendezvous documents under the run id. `finalize` may not read setup's output (KFP forbids an exit task any upstream
task): it gets `resume_run_id` and ends a resumed run only if this pipeline run resumed it.

Per role task, through kfp-kubernetes: the image from a pipeline parameter, GPUs (generation and training), the S3
credentials from the Kubernetes secret `asyncrl-s3` (never a parameter), the role servers' bearer token from the
secret `asyncrl-role-token`, and the endpoint from the config map
`asyncrl-endpoints`, `POD_IP` from the pod's
status (the address a role advertises), a memory-backed `/dev/shm` for NCCL and DataLoader shared memory,
tolerations and a node selector for GPU nodes, a timeout, and caching disabled (a role is never "cached").
"""



# ruff: noqa: UP045 - kfp 2.17 reads `Optional[int]` as an optional input; it refuses `int | None`
from typing import Optional

from kfp import dsl, kubernetes

from asyncrl.cluster.pipeline.components import finalize, role, setup, training_role
from asyncrl.cluster.pipeline.images import COMMITTED_REGISTRY, COMMITTED_TAG, image_refs

S3_SECRET = "asyncrl-s3"
S3_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}
ROLE_TOKEN_SECRET = "asyncrl-role-token"  # key ASYNCRL_ROLE_TOKEN: the role servers' bearer token
# MLflow's login (manifests: the server's basic-auth admin); optional, for an MLflow server without a login
MLFLOW_AUTH_SECRET = "asyncrl-mlflow-auth"
MLFLOW_AUTH_KEYS = {"MLFLOW_TRACKING_USERNAME": "MLFLOW_TRACKING_USERNAME",
                    "MLFLOW_TRACKING_PASSWORD": "MLFLOW_TRACKING_PASSWORD"}
# the tool sandbox pool's bearer token (manifests/sandbox/); optional, mapped into the environment tasks only
SANDBOX_TOKEN_SECRET = "asyncrl-sandbox-token"
ENDPOINTS_CONFIG_MAP = "asyncrl-endpoints"  # manifests/base/endpoints-configmap.yaml
GPU_RESOURCE = "nvidia.com/gpu"
ROLE_TIMEOUT_S = 7 * 24 * 3600
SETUP_TIMEOUT_S = 600
ROLE_LABEL = "asyncrl/role"
COMMITTED_IMAGES = image_refs(COMMITTED_REGISTRY, COMMITTED_TAG)  # `asyncrl pipeline compile` sets others
GENERATION_RETRIES = 3  # = the default generation.max_restarts of the embedded launcher


def _common(task: dsl.PipelineTask, image: str, role_name: str, timeout_s: int) -> dsl.PipelineTask:
    task.set_container_image(image)
    task.set_caching_options(False)
    kubernetes.use_secret_as_env(task, secret_name=S3_SECRET, secret_key_to_env=S3_SECRET_KEYS)
    kubernetes.use_secret_as_env(task, secret_name=ROLE_TOKEN_SECRET,
                                 secret_key_to_env={"ASYNCRL_ROLE_TOKEN": "ASYNCRL_ROLE_TOKEN"})
    kubernetes.use_secret_as_env(task, secret_name=MLFLOW_AUTH_SECRET, secret_key_to_env=MLFLOW_AUTH_KEYS,
                                 optional=True)
    kubernetes.use_config_map_as_env(task, config_map_name=ENDPOINTS_CONFIG_MAP,
                                     config_map_key_to_env={"AWS_ENDPOINT_URL": "AWS_ENDPOINT_URL"})
    kubernetes.use_field_path_as_env(task, env_name="POD_IP", field_path="status.podIP")
    kubernetes.add_pod_label(task, label_key="app.kubernetes.io/part-of", label_value="asyncrl")
    kubernetes.add_pod_label(task, label_key=ROLE_LABEL, label_value=role_name)
    kubernetes.set_timeout(task, timeout_s)
    task.set_env_variable("ASYNCRL_BIND_HOST", "0.0.0.0")
    return task


def _gpu(task: dsl.PipelineTask, gpus: int) -> dsl.PipelineTask:
    task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(gpus)
    kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory")
    kubernetes.add_toleration(task, key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")
    kubernetes.add_node_selector(task, label_key="nvidia.com/gpu.present", label_value="true")
    return task


@dsl.pipeline(name="asyncrl", description="Fully asynchronous RL post-training: generation (vLLM), environment, "
              "reward and training (DeepSpeed) as long-lived steps; trajectories through S3, runs in MLflow.")
def asyncrl_pipeline(
    config_yaml: str = "",
    model_path: Optional[str] = None,
    env_name: Optional[str] = None,
    loss: Optional[str] = None,
    async_ratio: Optional[int] = None,
    steps: Optional[int] = None,
    prompts_per_step: Optional[int] = None,
    samples_per_prompt: Optional[int] = None,
    generation_replica_ids: list = ["0"],  # noqa: B006 - KFP pipeline parameters are declared by their defaults
    environment_replica_ids: list = ["env0"],  # noqa: B006
    generation_gpus: int = 1,
    training_gpus: int = 1,
    generation_image: str = COMMITTED_IMAGES["generation_image"],
    training_image: str = COMMITTED_IMAGES["training_image"],
    light_image: str = COMMITTED_IMAGES["light_image"],
    s3_bucket: str = "asyncrl",
    s3_prefix: str = "runs",
    mlflow_uri: str = "http://mlflow.asyncrl.svc.cluster.local:5000",
    mlflow_experiment: Optional[str] = None,
    overrides: list = [],  # noqa: B006
    tags: list = [],  # noqa: B006
    resume_run_id: str = "",
) -> None:
    """Run one asyncrl training run: setup, the four roles side by side, finalize however the run ends.

    Config fields left empty keep the value of `config_yaml` (or the built-in default); a field you fill in wins
    over config_yaml, and `overrides` win over both. Replica ids, GPUs, bucket, prefix and mlflow_uri shape the pods
    or say where the run lives: setup fails, naming the field, if config_yaml contradicts them.

    Args:
        config_yaml: A whole run configuration as YAML text (e.g. configs/agentic.yaml); empty: the defaults.
        model_path: Config model.path: a model folder or s3:// URI of a Hugging Face folder; empty: as configured.
        env_name: Config env.name: an agentic environment (frozenlake, sokoban, tool_use, remote); empty: as configured.
        loss: Config training.loss (ppo, decoupled_ppo, tis, cispo, topr); empty: as configured.
        async_ratio: Config rollout.async_ratio, steps generation may run ahead of training; empty: as configured.
        steps: Config training.steps, the number of training steps; empty: as configured.
        prompts_per_step: Config rollout.prompts_per_step; empty: as configured.
        samples_per_prompt: Config rollout.samples_per_prompt (the group size); empty: as configured.
        generation_replica_ids: Generation pods, ids "0".."N-1" as a JSON list; sets generation.num_servers=N.
        environment_replica_ids: Environment pods, ids "env0".."envM-1"; sets rollout.num_writers=M.
        generation_gpus: GPUs of each generation pod.
        training_gpus: GPUs of the training pod, one DeepSpeed rank each; sets training.num_processes.
        generation_image: The generation image (vLLM), <registry>/asyncrl-generation:<tag> from make push-images.
        training_image: The training image (DeepSpeed), <registry>/asyncrl-training:<tag>.
        light_image: The image of setup, environment, reward and finalize, <registry>/asyncrl-light:<tag>.
        s3_bucket: The S3 bucket of the run's folder (endpoint and keys come from the cluster, never from here).
        s3_prefix: The prefix of the run's folder, s3://<s3_bucket>/<s3_prefix>/<run id>/.
        mlflow_uri: The MLflow tracking URI the run logs to (sets tracking.tracking_uri).
        mlflow_experiment: Config tracking.experiment, the MLflow experiment; empty: as configured.
        overrides: More config overrides, ["section.key=value", ...]; applied last, they win over every field.
        tags: More MLflow tags, ["key=value", ...].
        resume_run_id: Resume this crashed run (its first KFP run id) instead of starting a new one; empty: new run.
    """
    exit_task = finalize(bucket=s3_bucket, prefix=s3_prefix, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                         resume_run_id=resume_run_id)
    _common(exit_task, light_image, "finalize", SETUP_TIMEOUT_S)
    with dsl.ExitHandler(exit_task, name="asyncrl-run"):
        prepared = setup(bucket=s3_bucket, prefix=s3_prefix, config_yaml=config_yaml, overrides=overrides, tags=tags,
                         generation_ids=generation_replica_ids, environment_ids=environment_replica_ids,
                         model_path=model_path, env_name=env_name, loss=loss, async_ratio=async_ratio, steps=steps,
                         prompts_per_step=prompts_per_step, samples_per_prompt=samples_per_prompt,
                         training_processes=training_gpus, mlflow_uri=mlflow_uri, mlflow_experiment=mlflow_experiment,
                         generation_image=generation_image, training_image=training_image, light_image=light_image,
                         resume_run_id=resume_run_id)
        _common(prepared, light_image, "setup", SETUP_TIMEOUT_S).set_display_name("setup")
        run_id = prepared.outputs["run_id"]  # the KFP run id, or the resumed run's

        with dsl.ParallelFor(generation_replica_ids, name="generation-replicas") as gen_id:
            gen = role(module="asyncrl.roles.generation", bucket=s3_bucket, prefix=s3_prefix, run_id=run_id,
                       role_id=gen_id,
                       gpus=generation_gpus)
            _gpu(_common(gen.after(prepared), generation_image, "generation", ROLE_TIMEOUT_S), generation_gpus)
            gen.set_display_name("generation")
            # a lost generation pod (evicted, OOM-killed) comes back: the run goes on without it meanwhile, and the
            # new pod starts from the last committed checkpoint and joins the next weight-group epoch
            gen.set_retry(num_retries=GENERATION_RETRIES, backoff_duration="10s", backoff_factor=2.0,
                          backoff_max_duration="300s")

        train = training_role(bucket=s3_bucket, prefix=s3_prefix, run_id=run_id, processes=training_gpus)
        _gpu(_common(train.after(prepared), training_image, "training", ROLE_TIMEOUT_S), training_gpus)
        train.set_display_name("training")

        reward = role(module="asyncrl.roles.reward", bucket=s3_bucket, prefix=s3_prefix, run_id=run_id, role_id="0")
        _common(reward.after(prepared), light_image, "reward", ROLE_TIMEOUT_S).set_display_name("reward")

        with dsl.ParallelFor(environment_replica_ids, name="environment-replicas") as env_id:
            env = role(module="asyncrl.roles.environment", bucket=s3_bucket, prefix=s3_prefix, run_id=run_id,
                       role_id=env_id)
            _common(env.after(prepared), light_image, "environment", ROLE_TIMEOUT_S).set_display_name("environment")
            kubernetes.use_secret_as_env(env, secret_name=SANDBOX_TOKEN_SECRET, optional=True,
                                         secret_key_to_env={"ASYNCRL_SANDBOX_TOKEN": "ASYNCRL_SANDBOX_TOKEN"})
