"""The run layer: a RunSpec (spec) becomes a judge stack and an engine (engine: the local one; the Ray
one), driven by the one batch runner with the stop policy, with an outcome whose status decides the
exit code (run); and the runs built on it: compare, evaluation (rt4 eval), planning (rt4 estimate); guard/ (rt4
guard: the audit as an HTTP service)."""
