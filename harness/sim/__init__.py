"""The simulator: the same engine and strategies with each step's duration predicted by a cost model, the bulk
decode path that makes long runs cheap, routers for simulated clusters, and the tools that calibrate and check it."""
