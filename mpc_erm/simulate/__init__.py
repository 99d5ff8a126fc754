"""In-process m-party simulator: the reference every MPC result is checked against."""

from mpc_erm.simulate.aggregator import SIMULATION_TRUST_MODEL, InProcessAggregator
from mpc_erm.simulate.experiment import ExperimentConfig, run_experiment
from mpc_erm.simulate.methods import METHODS, Setting, run_method
from mpc_erm.simulate.parties import SimulatedParties

__all__ = [
    "METHODS",
    "SIMULATION_TRUST_MODEL",
    "ExperimentConfig",
    "InProcessAggregator",
    "Setting",
    "SimulatedParties",
    "run_experiment",
    "run_method",
]
