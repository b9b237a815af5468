"""Engine families: each engine's own scheduling rules, and the golden traces that check them.

`vllm_steps.VllmSteps` is vLLM V1's step scheduler (0.32) reproduced exactly; `workloads`,
`traces` and `trace_driver` are the family-neutral workloads, trace files and replay loop that
check a family against the real engine's scheduler (tests/data/engine_traces/).
"""
