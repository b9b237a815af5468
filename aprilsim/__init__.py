"""aprilsim: simulate, compare and tune rollout schedulers (APRIL and friends) for RL on LLMs."""

from aprilsim._version import __version__

__all__ = ["__version__", "check_scheduler", "sweep"]


def __getattr__(name: str):  # lazy: `import aprilsim` stays light (no scipy, no simpy, no pandas)
    if name == "check_scheduler":
        from aprilsim.conformance import check_scheduler

        return check_scheduler
    if name == "sweep":  # the package aprilsim.sweep, callable as aprilsim.sweep(scenario, grid)
        import importlib

        return importlib.import_module("aprilsim.sweep")
    raise AttributeError(f"module 'aprilsim' has no attribute {name!r}")
