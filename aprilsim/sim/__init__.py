"""The RL loop in simulated time (simpy): rollout, rewards, training, weight sync."""

from aprilsim.sim.runtime import Simulation
from aprilsim.trainer import TrainerModel

__all__ = ["Simulation", "TrainerModel"]
