"""Container components: the setup step, one long-lived role, and the finalize exit step.

Each is a thin container around an `asyncrl` entrypoint, the very command the embedded launcher runs
(`python -m asyncrl.roles.<role> --run-url s3://bucket/prefix/<run id> --id <id>`), started through the images' one
entrypoint `asyncrl-task` (`asyncrl-task MODULE ARGS` = `python -m MODULE ARGS` with the interpreter asyncrl is
installed in: `python3` in the vLLM image, the venv's `python` in the others; asyncrl/task_entrypoint.py).
The run id is setup's output parameter `run_id`: the KFP run id for a new run, the resumed run's id with the pipeline parameter `resume_run_id`. Images are set per task by
the pipeline (`set_container_image`, from pipeline parameters); the defaults below are only placeholders the
pipeline always replaces. S3 credentials and endpoint come from the Kubernetes secret `asyncrl-s3` (see
asyncrl/cluster/pipeline/definition.py), never from a parameter.
"""



# ruff: noqa: UP045 - kfp 2.17 reads `Optional[int]` as an optional input; it refuses `int | None`
from typing import Optional

from kfp import dsl

PLACEHOLDER_IMAGE = "asyncrl-light:set-by-pipeline"
TASK_ENTRYPOINT = "asyncrl-task"  # the console script every image installs with the asyncrl wheel


def run_url_placeholder(bucket: str, prefix: str, run_id: str) -> dsl.ConcatPlaceholder:
    """s3://<bucket>/<prefix>/<run id>, resolved by the KFP backend when the task starts."""
    return dsl.ConcatPlaceholder(["s3://", bucket, "/", prefix, "/", run_id])


# The UI's config fields: (setup input, the config field it sets). Left empty in the run form (None), a field passes
# no `--set` at all (dsl.IfPresentPlaceholder), so the configuration's own value stands (docs/pipeline_form.md).
FORM_CONFIG_FIELDS = (("loss", "training.loss"), ("async_ratio", "rollout.async_ratio"), ("steps", "training.steps"),
                      ("prompts_per_step", "rollout.prompts_per_step"),
                      ("samples_per_prompt", "rollout.samples_per_prompt"),
                      ("mlflow_experiment", "tracking.experiment"))


def _if_present(name: str, value: object, *flag: object) -> dsl.IfPresentPlaceholder:
    return dsl.IfPresentPlaceholder(input_name=name, then=[*flag, value])


@dsl.container_component
def setup(bucket: str, prefix: str, config_yaml: str, overrides: list, tags: list, generation_ids: list,
          environment_ids: list, training_processes: int, training_nodes: int, mlflow_uri: str, generation_image: str,
          training_image: str, light_image: str, resume_run_id: str, run_id: dsl.OutputPath(str),
          mlflow_run: dsl.Output[dsl.Markdown], model_path: Optional[str] = None, env_name: Optional[str] = None,
          loss: Optional[str] = None, async_ratio: Optional[int] = None, steps: Optional[int] = None,
          prompts_per_step: Optional[int] = None, samples_per_prompt: Optional[int] = None,
          mlflow_experiment: Optional[str] = None, generation_gpus: int = 1, gang_pods: int = 0):
    """Validate the configuration and write it to S3 under the run; the MLflow run is tagged with the three image
    references. Precedence (`asyncrl.cluster.setup_config`): defaults < `config_yaml` < the form's config fields
    (only those given: each optional input passes its `--set` only if present) < `overrides`; the replica ids,
    `training_processes` (x `training_nodes`), `generation_gpus` (the replicas' tensor parallelism), the bucket, prefix
    and `mlflow_uri` shape the pods or say where the run lives, so they
    are authoritative and a configuration that contradicts them fails setup. KFP passes the list parameters as
    JSON text. With `resume_run_id`, resume that run instead (`asyncrl.run.resume`). Outputs `run_id` (the run
    every role drives) and `mlflow_run` (a Markdown link to the MLflow run)."""
    values = {"loss": loss, "async_ratio": async_ratio, "steps": steps, "prompts_per_step": prompts_per_step,
              "samples_per_prompt": samples_per_prompt, "mlflow_experiment": mlflow_experiment}
    form_sets = [_if_present(name, dsl.ConcatPlaceholder([f"{field}=", values[name]]), "--set")
                 for name, field in FORM_CONFIG_FIELDS]
    return dsl.ContainerSpec(
        image=PLACEHOLDER_IMAGE,
        command=[TASK_ENTRYPOINT, "asyncrl.cluster.setup"],
        args=["--bucket", bucket, "--prefix", prefix, "--run-id", dsl.PIPELINE_JOB_ID_PLACEHOLDER,
              "--config-yaml", config_yaml,
              _if_present("model_path", model_path, "--model-path"), _if_present("env_name", env_name, "--env-name"),
              *form_sets,
              "--generation-ids-json", generation_ids, "--environment-ids-json", environment_ids,
              "--training-processes", training_processes, "--training-nodes", training_nodes,
              "--generation-gpus", generation_gpus, "--mlflow-uri", mlflow_uri,
              "--tag", dsl.ConcatPlaceholder(["image.generation=", generation_image]),
              "--tag", dsl.ConcatPlaceholder(["image.training=", training_image]),
              "--tag", dsl.ConcatPlaceholder(["image.light=", light_image]),
              "--overrides-json", overrides, "--tags-json", tags, "--resume-run-id", resume_run_id,
              "--gang-pods", gang_pods,  # the compiled Kueue pod group's size (pods.py): checked against the replicas
              "--run-id-output", run_id, "--mlflow-link-output", mlflow_run.path],
    )


@dsl.container_component
def role(module: str, bucket: str, prefix: str, run_id: str, role_id: str, gpus: int = 0):
    """One long-lived role: `python -m <module> --run-url ... --id <role_id>`, bound to all interfaces and
    advertising the pod IP; it exits by itself when the run is done or a peer is gone past its deadline.

    `gpus` is not read by the command: it is the task input the pipeline's GPU limit refers to. Inside a
    ParallelFor, a resource limit that names a pipeline parameter directly is not wired into the loop's DAG
    inputs by the compiler (KFP's driver then fails the task), while a component argument is."""
    return dsl.ContainerSpec(
        image=PLACEHOLDER_IMAGE,
        command=[TASK_ENTRYPOINT, module],
        args=["--run-url", run_url_placeholder(bucket, prefix, run_id), "--id", role_id, "--host", "0.0.0.0"],
    )


@dsl.container_component
def training_role(bucket: str, prefix: str, run_id: str, processes: int):
    """The training role under torchrun: one data-parallel DeepSpeed rank per GPU of the pod (`processes`, which
    setup also wrote as `training.num_processes`); rank 0 leads (reads S3, pushes weights, logs, checkpoints)."""
    return dsl.ContainerSpec(
        image=PLACEHOLDER_IMAGE,
        command=[TASK_ENTRYPOINT, "torch.distributed.run"],  # what the `torchrun` script runs
        args=["--standalone", "--nnodes", "1", "--nproc-per-node", processes, "-m", "asyncrl.roles.training",
              "--run-url", run_url_placeholder(bucket, prefix, run_id), "--id", "0", "--host", "0.0.0.0"],
    )


@dsl.container_component
def training_job_launcher(bucket: str, prefix: str, run_id: str, nodes: int, processes: int, image: str,
                          timeout_s: int):
    """The training role on `nodes` nodes of `processes` GPUs each: creates a Kubeflow Trainer `TrainJob` (or a
    `PyTorchJob` where only the training operator is installed) whose pods run the training role under a
    multi-node torchrun, follows it to its end and deletes it when stopped (`asyncrl.cluster.training_launcher`;
    the objects: `asyncrl.cluster.training_job`). Runs in the light image; `image` is the training pods' image."""
    return dsl.ContainerSpec(
        image=PLACEHOLDER_IMAGE,
        command=[TASK_ENTRYPOINT, "asyncrl.cluster.training_launcher"],
        args=["--nodes", nodes, "--gpus-per-node", processes, "--image", image,
              "--run-url", run_url_placeholder(bucket, prefix, run_id), "--engine", "auto", "--timeout-s", timeout_s],
    )


@dsl.component(base_image=PLACEHOLDER_IMAGE, install_kfp_package=False)
def finalize(bucket: str, prefix: str, run_id: str, resume_run_id: str, status: dsl.PipelineTaskFinalStatus):
    """The exit step: mark the run done (every role exits), record the pipeline's final status, register the
    final model in MLflow. A Python component because only those receive the final status; the light image has
    kfp installed, so nothing is installed at run time. `run_id` is the KFP run id: an exit task may not read
    setup's output, so a resumed run is named by `resume_run_id`, and finalize ends it only if this pipeline run
    resumed it (`asyncrl.cluster.finalize --kfp-run-id`)."""
    import subprocess
    import sys

    run = resume_run_id or run_id
    subprocess.run([sys.executable, "-m", "asyncrl.cluster.finalize", "--run-url", f"s3://{bucket}/{prefix}/{run}",
                    "--status", status.state, "--kfp-run-id", run_id], check=True, timeout=600)
