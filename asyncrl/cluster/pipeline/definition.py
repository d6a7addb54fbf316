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

Training runs in its task's pod (`torchrun --standalone`, `training_gpus` ranks) when `training_nodes` is 1; above 1
the task (a `dsl.Else` branch) is the launcher that runs it as a TrainJob/PyTorchJob over the nodes
(`asyncrl.cluster.training_launcher`, docs/multinode_training.md).

Per role task, through kfp-kubernetes: the image from a pipeline parameter, GPUs (generation and training), the S3
credentials from the Kubernetes secret `asyncrl-s3` (never a parameter), the role servers' bearer token from the
secret `asyncrl-role-token`, and the endpoint from the config map
`asyncrl-endpoints`, `POD_IP` from the pod's
status (the address a role advertises), a timeout, and caching disabled (a role is never "cached"); its size and
scheduling from `pods.py` (`pods.place`: CPU/memory per role, node selector, tolerations, image pull secret, the
model cache volume, a sized memory-backed `/dev/shm` for the GPU roles, Kueue's queue and pod group).
"""



# ruff: noqa: UP045 - kfp 2.17 reads `Optional[int]` as an optional input; it refuses `int | None`
from typing import Optional

from kfp import dsl, kubernetes

from asyncrl.cluster.pipeline import pods
from asyncrl.cluster.pipeline.components import finalize, role, setup, training_job_launcher, training_role
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
    kubernetes.add_toleration(task, key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")
    pods.mount_shm(task, pods.current_layout())  # sized; node selector and more tolerations: pods.schedule_pod
    return task


def _training_launcher(task: dsl.PipelineTask, image: str) -> dsl.PipelineTask:
    """The multi-node training task: no secret (the job's pods read theirs by reference), its own pod's name and
    uid (the job's owner), the role labels, the role timeout plus the launcher's grace to delete the job."""
    task.set_container_image(image)
    task.set_caching_options(False)
    kubernetes.use_field_path_as_env(task, env_name="ASYNCRL_POD_NAME", field_path="metadata.name")
    kubernetes.use_field_path_as_env(task, env_name="ASYNCRL_POD_UID", field_path="metadata.uid")
    kubernetes.add_pod_label(task, label_key="app.kubernetes.io/part-of", label_value="asyncrl")
    kubernetes.add_pod_label(task, label_key=ROLE_LABEL, label_value="training-launcher")
    kubernetes.set_timeout(task, ROLE_TIMEOUT_S + SETUP_TIMEOUT_S)
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
    training_nodes: int = 1,
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
    # pod sizing and scheduling (asyncrl/cluster/pipeline/pods.py); defaults for one 8-GPU node
    generation_cpu_request: str = "8",
    generation_cpu_limit: str = "16",
    generation_memory_request: str = "64Gi",
    generation_memory_limit: str = "64Gi",
    training_cpu_request: str = "16",
    training_cpu_limit: str = "32",
    training_memory_request: str = "128Gi",
    training_memory_limit: str = "128Gi",
    environment_cpu_request: str = "2",
    environment_cpu_limit: str = "4",
    environment_memory_request: str = "4Gi",
    environment_memory_limit: str = "8Gi",
    reward_cpu_request: str = "2",
    reward_cpu_limit: str = "4",
    reward_memory_request: str = "4Gi",
    reward_memory_limit: str = "8Gi",
    setup_cpu_request: str = "2",
    setup_cpu_limit: str = "4",
    setup_memory_request: str = "8Gi",
    setup_memory_limit: str = "8Gi",
    gpu_node_selector: dict = {"nvidia.com/gpu.present": "true"},  # noqa: B006
    gpu_tolerations: list = [],  # noqa: B006 - more than the nvidia.com/gpu taint, always tolerated (_gpu)
    cpu_node_selector: dict = {},  # noqa: B006
    cpu_tolerations: list = [],  # noqa: B006
    registry_login: str = "asyncrl-registry",
) -> None:
    """Run one asyncrl training run: setup, the four roles side by side, finalize however the run ends.

    Config fields left empty keep the value of `config_yaml` (or the built-in default); a field you fill in wins
    over config_yaml, and `overrides` win over both. Replica ids, GPUs, bucket, prefix and mlflow_uri shape the pods
    or say where the run lives: setup fails, naming the field, if config_yaml contradicts them.

    Args:
        config_yaml: A whole run configuration as YAML text (e.g. configs/agentic.yaml); empty: the defaults.
        model_path: Config model.path: a model folder or s3:// URI of a Hugging Face folder; empty: as configured.
        env_name: Config env.name: an agentic environment (frozenlake, sokoban, tool_use, remote); empty: as configured.
        loss: Config training.loss (ppo, decoupled_ppo, tis, cispo, topr, gspo); empty: as configured.
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
        training_nodes: Nodes of the training role; above 1 it runs as a TrainJob/PyTorchJob of training_nodes x training_gpus ranks.
        generation_cpu_request: CPU request of each generation replica's pod (a Kubernetes quantity, e.g. 8 or 500m).
        generation_cpu_limit: CPU limit of each generation replica's pod.
        generation_memory_request: Memory request of each generation replica's pod (e.g. 64Gi).
        generation_memory_limit: Memory limit of each generation replica's pod (its /dev/shm counts against it).
        training_cpu_request: CPU request of the training pod.
        training_cpu_limit: CPU limit of the training pod.
        training_memory_request: Memory request of the training pod.
        training_memory_limit: Memory limit of the training pod (its /dev/shm counts against it).
        environment_cpu_request: CPU request of each environment replica's pod.
        environment_cpu_limit: CPU limit of each environment replica's pod.
        environment_memory_request: Memory request of each environment replica's pod.
        environment_memory_limit: Memory limit of each environment replica's pod.
        reward_cpu_request: CPU request of the reward pod.
        reward_cpu_limit: CPU limit of the reward pod.
        reward_memory_request: Memory request of the reward pod.
        reward_memory_limit: Memory limit of the reward pod.
        setup_cpu_request: CPU request of the setup and finalize pods.
        setup_cpu_limit: CPU limit of the setup and finalize pods.
        setup_memory_request: Memory request of the setup and finalize pods.
        setup_memory_limit: Memory limit of the setup and finalize pods.
        gpu_node_selector: Node labels the generation and training pods must match (a JSON object).
        gpu_tolerations: More tolerations of the GPU pods, as a JSON list of Kubernetes tolerations (nvidia.com/gpu is always tolerated).
        cpu_node_selector: Node labels every other pod must match (a JSON object; {} for any node).
        cpu_tolerations: Tolerations of every other pod (a JSON list of Kubernetes tolerations).
        registry_login: Name of the docker-registry Secret the kubelet pulls the images with (a missing one only warns).
    """
    exit_task = finalize(bucket=s3_bucket, prefix=s3_prefix, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                         resume_run_id=resume_run_id)
    _common(exit_task, light_image, "finalize", SETUP_TIMEOUT_S)
    setup_size = pods.Size(setup_cpu_request, setup_cpu_limit, setup_memory_request, setup_memory_limit)
    cpu_nodes = pods.Nodes(cpu_node_selector, cpu_tolerations, registry_login)
    gpu_nodes = pods.Nodes(gpu_node_selector, gpu_tolerations, registry_login)
    pods.place(exit_task, setup_size, cpu_nodes, cache=False, gang=False)
    with dsl.ExitHandler(exit_task, name="asyncrl-run"):
        prepared = setup(bucket=s3_bucket, prefix=s3_prefix, config_yaml=config_yaml, overrides=overrides, tags=tags,
                         generation_ids=generation_replica_ids, environment_ids=environment_replica_ids,
                         model_path=model_path, env_name=env_name, loss=loss, async_ratio=async_ratio, steps=steps,
                         prompts_per_step=prompts_per_step, samples_per_prompt=samples_per_prompt,
                         training_processes=training_gpus, training_nodes=training_nodes, mlflow_uri=mlflow_uri,
                         mlflow_experiment=mlflow_experiment,
                         generation_image=generation_image, training_image=training_image, light_image=light_image,
                         resume_run_id=resume_run_id, generation_gpus=generation_gpus,
                         gang_pods=pods.current_layout().gang_pods)
        _common(prepared, light_image, "setup", SETUP_TIMEOUT_S).set_display_name("setup")
        pods.place(prepared, setup_size, cpu_nodes, cache=True, gang=False)
        run_id = prepared.outputs["run_id"]  # the KFP run id, or the resumed run's

        with dsl.ParallelFor(generation_replica_ids, name="generation-replicas") as gen_id:
            gen = role(module="asyncrl.roles.generation", bucket=s3_bucket, prefix=s3_prefix, run_id=run_id,
                       role_id=gen_id,
                       gpus=generation_gpus)
            _gpu(_common(gen.after(prepared), generation_image, "generation", ROLE_TIMEOUT_S), generation_gpus)
            gen.set_display_name("generation")
            pods.place(gen, pods.Size(generation_cpu_request, generation_cpu_limit, generation_memory_request,
                                      generation_memory_limit), gpu_nodes, cache=True, gang=True)
            # a lost generation pod (evicted, OOM-killed) comes back: the run goes on without it meanwhile, and the
            # new pod starts from the last committed checkpoint and joins the next weight-group epoch
            gen.set_retry(num_retries=GENERATION_RETRIES, backoff_duration="10s", backoff_factor=2.0,
                          backoff_max_duration="300s")

        # ---- training: torchrun in this pod (1 node), or a TrainJob/PyTorchJob over several nodes ----
        with dsl.If(training_nodes == 1, name="training-one-node"):
            train = training_role(bucket=s3_bucket, prefix=s3_prefix, run_id=run_id, processes=training_gpus)
            _gpu(_common(train.after(prepared), training_image, "training", ROLE_TIMEOUT_S), training_gpus)
            train.set_display_name("training")
            pods.place(train, pods.Size(training_cpu_request, training_cpu_limit, training_memory_request,
                                        training_memory_limit), gpu_nodes, cache=True, gang=True)
        with dsl.Else(name="training-several-nodes"):
            # the job's pods are sized, placed and gang-scheduled by the job (asyncrl.cluster.training_job); the
            # launcher itself is a small pod on the CPU nodes, in the run's pod group in place of the training pod
            launch = training_job_launcher(bucket=s3_bucket, prefix=s3_prefix, run_id=run_id, nodes=training_nodes,
                                           processes=training_gpus, image=training_image, timeout_s=ROLE_TIMEOUT_S)
            _training_launcher(launch.after(prepared), light_image).set_display_name("training")
            pods.place(launch, setup_size, cpu_nodes, cache=False, gang=True)

        reward = role(module="asyncrl.roles.reward", bucket=s3_bucket, prefix=s3_prefix, run_id=run_id, role_id="0")
        _common(reward.after(prepared), light_image, "reward", ROLE_TIMEOUT_S).set_display_name("reward")
        pods.place(reward, pods.Size(reward_cpu_request, reward_cpu_limit, reward_memory_request, reward_memory_limit),
                   cpu_nodes, cache=True, gang=True)

        with dsl.ParallelFor(environment_replica_ids, name="environment-replicas") as env_id:
            env = role(module="asyncrl.roles.environment", bucket=s3_bucket, prefix=s3_prefix, run_id=run_id,
                       role_id=env_id)
            _common(env.after(prepared), light_image, "environment", ROLE_TIMEOUT_S).set_display_name("environment")
            pods.place(env, pods.Size(environment_cpu_request, environment_cpu_limit, environment_memory_request,
                                      environment_memory_limit), cpu_nodes, cache=True, gang=True)
            kubernetes.use_secret_as_env(env, secret_name=SANDBOX_TOKEN_SECRET, optional=True,
                                         secret_key_to_env={"ASYNCRL_SANDBOX_TOKEN": "ASYNCRL_SANDBOX_TOKEN"})
