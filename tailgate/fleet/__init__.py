"""Engine replicas behind one endpoint (`tailgate serve --replicas N`): the routing policy
(`policy.py`, plain Python, shared with the simulator) and the Ray Serve pieces (`deployment.py`,
`router.py`, `front.py`, `metrics.py`), which only `--replicas N > 1` imports: Ray is the `ray`
extra, never needed by a single-process server."""
