"""asyncrl.tiny_model: the built-in tiny model's builder (architecture, supervised warm start, cache).

Development and benchmark tooling, called only by whoever prepares a run (the embedded launcher, the cluster's
setup step, `asyncrl build-model`, benchmarks): a role process only ever receives a finished model folder
(`asyncrl.models.folder`).
"""
