"""Simulator and planner: the real rollout scheduler driven by a virtual clock and a GPU cost model."""

from asyncrl.sim.config import Failure, SimConfig, Slowdown
from asyncrl.sim.cost_model import CostModel, preset
from asyncrl.sim.report import SimResult
from asyncrl.sim.simulator import Simulator, simulate
from asyncrl.sim.workload import Dist, Workload, agentic_workload, rlvr_workload

__all__ = ["CostModel", "Dist", "Failure", "SimConfig", "SimResult", "Simulator", "Slowdown", "Workload",
           "agentic_workload", "preset", "rlvr_workload", "simulate"]
