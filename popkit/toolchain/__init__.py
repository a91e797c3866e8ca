"""Compilers and builds: target architectures, build locks, the compile pre-step's index, HIP without ROCm and HIP on CUDA."""
