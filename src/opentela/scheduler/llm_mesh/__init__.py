"""LLM-Mesh's serverless serving of many models on shared CPU and GPU nodes, simulated event by event.

`profiles` builds the performance profiles, `workload` the synthetic stand-in for the Azure traces, `memory` and
`orchestrator` the memory subsystem, `node` and `cluster` the simulation, `mesh_policy` LLM-Mesh's placement and
`sllm_policy` the ServerlessLLM baselines (`policies` picks one by name); `evaluation` runs the paper's 8.2 grid.
"""
