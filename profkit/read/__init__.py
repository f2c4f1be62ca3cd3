"""Reading: Nsight Systems SQLite exports (plain or compressed), ncu counters, GPU metrics -> typed frames and the Trace container. Imports nothing from the layers above."""
