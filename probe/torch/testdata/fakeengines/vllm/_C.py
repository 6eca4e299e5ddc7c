"""Stands in for vllm's compiled extension; GPUPIN_FAKE_VLLM_C=broken makes it fail to load."""
import os

if os.environ.get("GPUPIN_FAKE_VLLM_C") == "broken":
    raise ImportError("libcudart.so.13: cannot open shared object file: No such file or directory")
