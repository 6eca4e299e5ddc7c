"""A stand-in for vllm whose compiled extension lives in _C."""
__version__ = "0.11.0+fake"
