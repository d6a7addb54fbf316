"""Held-out evaluation through the live generation servers (HTTP I/O; the pure rollout logic is `asyncrl.rollout`).

- `asyncrl.evaluation.single_turn.evaluate`: greedy accuracy on a task's held-out problems;
- `asyncrl.evaluation.agentic.evaluate_agentic`: greedy success rate on an agentic task's held-out levels;
- `asyncrl.evaluation.agent_eval.evaluate_agent`: the same for an agent function (`env.agent`), through an episode
  endpoint of its own.
"""
