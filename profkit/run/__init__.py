"""The model of the run: the steady-state window, attribution of GPU work to ops, the run summary, and the step graph (profkit.run.step)."""
