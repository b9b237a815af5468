"""aprilsim: simulate, compare and tune rollout schedulers (APRIL and friends) for RL on LLMs."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`aprilsim.sweep(...)` without importing sweeps (or pandas) when aprilsim is imported."""
    if name == "sweep":
        import importlib

        return importlib.import_module("aprilsim.sweep")
    raise AttributeError(f"module 'aprilsim' has no attribute {name!r}")
