"""Triton kernels of the selective scan and their launchers (imported on first CUDA use)."""
