"""The parts of `benchmarks/efficiency.py`: each measures one figure of one job.

- `raw_engine`: `vllm.LLM` in-process on the job's model and prompts (a subprocess of its own);
- `train_step`: one `Learner.train_step` on a batch of the step's shape (a subprocess of its own);
- `e2e`: the real `asyncrl run`, with the CPU time of every process of its tree sampled by class;
- `trl_part` / `trl_worker`: TRL's `GRPOTrainer` in a virtualenv of its own (`.cache/bench-trl-venv`);
- `sim_part`: the simulator's `cpu-tiny` prediction;
- `common`: paths, job parameters, running a part in a subprocess.
"""
