"""Capturing: running a script under Nsight Systems and Nsight Compute, the bootstrap that runs it (aten recorder, calibration), merging counters, measuring peaks."""
