"""Stands in for vllm's compiled extension.

GPUPIN_FAKE_VLLM_C=broken makes it fail to load as a build for another CUDA
does; =nodriver as one that links the driver does on a node without one.
"""
import os

if os.environ.get("GPUPIN_FAKE_VLLM_C") == "broken":
    raise ImportError("libcudart.so.13: cannot open shared object file: No such file or directory")
if os.environ.get("GPUPIN_FAKE_VLLM_C") == "nodriver":
    raise ImportError("libcuda.so.1: cannot open shared object file: No such file or directory")
