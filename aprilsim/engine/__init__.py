"""Simulated inference engines: cost model, the fast event-jumping engine, the router."""

from aprilsim.engine.cost import PRESETS, CostModel, DecodeCost, EngineSpec, TabulatedCost
from aprilsim.engine.fast import FastEngine
from aprilsim.engine.protocol import SimEngine
from aprilsim.engine.request import Completion, Request
from aprilsim.engine.speculative_spec import SpeculativeSpec

__all__ = [
    "PRESETS",
    "Completion",
    "CostModel",
    "DecodeCost",
    "EngineSpec",
    "FastEngine",
    "Request",
    "SimEngine",
    "SpeculativeSpec",
    "TabulatedCost",
]
