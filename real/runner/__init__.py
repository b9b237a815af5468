"""The live runner: aprilsim's schedulers, unchanged, on live engines (``aprilsim run``).

- :mod:`.runtime`: the asyncio driver of the rollout core (`aprilsim.rollout`, the simulator's core
  too);
- :mod:`.cluster`: the engines, routing, liveness, per-engine counters;
- :mod:`.source`: replay (the scenario's workload) and free mode (prompt file, EOS, rewards);
- :mod:`.trainer`: the trainer stand-in (the TrainerModel formula, or a user callable);
- :mod:`.local`: in-process bundled engines with pause and weight sync (``--local N``);
- :mod:`.options`: the live commands' typed options (``EngineTarget``, ``FreeMode``,
  ``RunOptions``);
- :mod:`.api`: the library: ``run_live`` / ``build_runtime`` (one scheduler), ``connect_cluster``,
  ``run_schedulers`` (all of ``aprilsim run`` but the printing); :mod:`.cli`: the command.
"""
