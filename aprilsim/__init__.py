"""aprilsim: simulate, compare and tune rollout schedulers (APRIL and friends) for RL on LLMs."""

__version__ = "0.1.0"
