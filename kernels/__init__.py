"""Persistent decode kernel ("monokernel") for one GPU: instruction set, schedule builder, CPU twin, build.

Nothing here imports torch's C++ headers: the CUDA code builds with plain nvcc into a shared library that
Python loads through ctypes (kernels/build.py), so a kernel edit rebuilds in seconds.
"""
