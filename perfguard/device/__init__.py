"""The machine a case runs on: what the workloads may import to time and place their work.

`platform` (the probe and the device protocol: CUDA, ROCm, Ascend NPU, CPU), `timer` (the
stage timer the pipelines open their stages on), `inject` (the self-test's slowdowns),
`threads` (the thread policy), `pinning` (CPU cores per worker) and `reference` (the
workload that tells how fast the runner is). It sits below `perfguard.workloads`, which
time their stages through it, and below `perfguard.measurement`, which runs them.
"""
