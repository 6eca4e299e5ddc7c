"""A stand-in for sglang without sgl_kernel, which the probe treats as absent, not broken."""
__version__ = "0.5.0+fake"
