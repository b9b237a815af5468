"""aprilsim: simulate, compare and tune rollout schedulers (APRIL and friends) for RL on LLMs."""

import os as _os

from aprilsim._version import __version__

# a compiled install, run as pure Python (aprilsim.native)
if _os.environ.get("APRILSIM_PURE") == "1":
    from aprilsim.native import prefer_source

    prefer_source()
else:  # a compiled install without mypyc's runtime library runs pure Python too (it warns)
    from aprilsim.native import fall_back_without_runtime

    fall_back_without_runtime()

__all__ = [
    "Scenario", "__version__", "check_scheduler", "compiled", "load_scenario", "scenario_from_dict",
    "simulate", "sweep",
]


def __getattr__(name: str):  # lazy: `import aprilsim` stays light (no scipy, no simpy, no pandas)
    if name == "check_scheduler":
        from aprilsim.conformance import check_scheduler

        return check_scheduler
    if name == "compiled":  # aprilsim.compiled(): True on the opt-in mypyc build
        from aprilsim.native import compiled

        return compiled
    if name == "simulate":
        from aprilsim.notebook import simulate

        return simulate
    if name in ("Scenario", "load_scenario", "scenario_from_dict"):
        import aprilsim.config as config

        return getattr(config, name)
    if name == "sweep":  # the package aprilsim.sweep, callable as aprilsim.sweep(scenario, grid)
        import importlib

        return importlib.import_module("aprilsim.sweep")
    raise AttributeError(f"module 'aprilsim' has no attribute {name!r}")
