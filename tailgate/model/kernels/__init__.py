"""The matmul and attention kernels and the choice among them: `csrc/` (our C sources: the q8 matmul,
GGUF blocks, decode attention, fused elementwise ops; shipped in the wheel, compiled at first use),
`native.py` (builds and loads them through ctypes), `blocks.py` (GGUF matrices as stored and the
matmul over them), `cpu.py` (what the CPU can do, from cpuinfo text), `choice.py` (`choose()`: one
`KernelPlan` per machine, and `Linear`, the weight matrix that picks its kernel by row count) and
`probe.py` (the start-up probe: step shapes timed on this CPU to seed the step-cost model and set a
plan's row cut). It is the bottom of the model rooms: `runtime/` and `formats/` call into it, and it
reads no other room's code except the probe, which is handed a runner to time and keeps its cache
beside `formats/`' cache root.
"""
