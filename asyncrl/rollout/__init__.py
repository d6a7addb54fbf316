"""asyncrl.rollout: the pure (sans-IO) rollout engine: the scheduler, its decisions, per-sample workload shaping
and multi-turn trajectory bookkeeping. Nothing here sends, sleeps or reads a clock; the environment role
(`asyncrl.roles.rollout_driver`) and the simulator (`asyncrl.sim`) drive it, `asyncrl.evaluation` does held-out
evaluation through the servers."""
