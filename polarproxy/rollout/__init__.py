"""`polarproxy rollout`: run tasks as sandboxed, recorded, verified episodes through staged worker pools.

tasks (the TASKS JSONL file) -> stages (prewarm, execute, evaluate, reconstruct) -> run (orchestration,
resume, summary); gateway (episodes through the control API); sandbox (none | bwrap | docker | apptainer)
and bridge (the Unix-socket path from a network-less sandbox to the gateway) isolate the harness.
See docs/rollout.md.
"""
