"""Engine replicas behind one endpoint (`tailgate serve --replicas N`, docs/scale-out.md): the
routing policy (`policy.py`, plain Python, shared with the simulator) and the Ray Serve pieces
(`replica.py`, `router.py`, `front.py`, `metrics.py`, `launch.py`), which only `--replicas N > 1`
imports: Ray is the `ray` extra, never needed by a single-process server."""
