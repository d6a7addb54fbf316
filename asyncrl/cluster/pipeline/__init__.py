"""The Kubeflow pipeline of asyncrl, inside the package (no `sys.path` edit needed to compile it).

`components.py`: the container components (setup, one long-lived role, the training role under torchrun, the
finalize exit step), thin wrappers around `asyncrl.cluster.setup|finalize` and `asyncrl.roles.<role>`, started
through the images' entrypoint `asyncrl-task MODULE` (asyncrl/task_entrypoint.py).
`definition.py`: the pipeline graph (`asyncrl_pipeline`) and what each task gets through kfp-kubernetes.
`asyncrl.yaml` (`COMPILED`): the compiled KFP IR YAML, committed; `asyncrl pipeline compile` rewrites it and
tests/unit/test_pipeline.py fails when it is stale; the repository's pipelines/ and components/ are generated from
the same code (`asyncrl.cluster.kfp_files`, `make kfp-files`). Importing this package imports no `kfp`.
"""

from pathlib import Path

COMPILED = Path(__file__).resolve().with_name("asyncrl.yaml")
