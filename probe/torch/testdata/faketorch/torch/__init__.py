"""A stand-in for torch, so the probe's control flow runs on a machine without a GPU.

It is configured by GPUPIN_FAKE_TORCH, a JSON object:
  version, cuda        torch.__version__, torch.version.cuda
  available            torch.cuda.is_available()
  warning              a UserWarning is_available() emits (as torch does for an old driver)
  init_error           what torch.cuda.init() raises
  arch_list            the build's arch list: torch.cuda.get_arch_list() (which, as
                       torch's does, answers [] when no GPU is available) and
                       torch._C._cuda_getArchFlags()
  no_arch_flags        torch._C has no _cuda_getArchFlags (CPU-only builds)
  devices              [{name, cc: [major, minor], uuid, mismatch, nan, raise}]; a
                       device without "uuid" has no props.uuid at all, as in
                       PyTorch before 2.x (the probe then asks libcuda.so.1)
Tensors are symbolic: every element of a tensor has the same value, which is
enough to model a correct matmul, a wrong one (mismatch) and NaN.
"""

import json
import os
import types
import warnings

_cfg = json.loads(os.environ.get("GPUPIN_FAKE_TORCH", "{}"))
__version__ = _cfg.get("version", "2.8.0+fake")
version = types.SimpleNamespace(cuda=_cfg.get("cuda", "12.9"))

bfloat16 = "bfloat16"
float32 = "float32"


def _device(name):
    idx = int(str(name).split(":")[1])
    return _cfg["devices"][idx]


class Tensor:
    def __init__(self, val, dtype, device, shape):
        self.val, self.dtype, self.device, self.shape = val, dtype, device, shape

    def __matmul__(self, other):
        val = self.val * other.val * self.shape[1]
        dev = _device(self.device)
        if self.dtype == bfloat16 and dev.get("mismatch"):
            val *= 1.5
        if dev.get("nan"):
            val = float("nan")
        return Tensor(val, self.dtype, self.device, (self.shape[0], other.shape[1]))

    def __sub__(self, other):
        return Tensor(self.val - other.val, self.dtype, self.device, self.shape)

    def float(self):
        return Tensor(self.val, float32, self.device, self.shape)

    def abs(self):
        return Tensor(abs(self.val), self.dtype, self.device, self.shape)

    def max(self):
        return Tensor(self.val, self.dtype, self.device, ())

    def item(self):
        return float(self.val)


def manual_seed(seed):
    return None


def randn(shape, device=None, dtype=float32):
    dev = _device(device)
    if dev.get("raise"):
        raise RuntimeError(dev["raise"])
    return Tensor(1.0, dtype, device, tuple(shape))


class _Props:
    def __init__(self, d):
        self.name = d.get("name", "Fake GPU")
        if "uuid" in d:
            self.uuid = d["uuid"]
        self.major, self.minor = d.get("cc", [9, 0])


class _Cuda:
    def is_available(self):
        if _cfg.get("warning"):
            warnings.warn(_cfg["warning"], UserWarning)
        return _cfg.get("available", True)

    def device_count(self):
        return len(_cfg.get("devices", []))

    def init(self):
        if _cfg.get("init_error"):
            raise RuntimeError(_cfg["init_error"])

    def driver_version(self):
        return _cfg.get("driver_version", 12090)

    def get_arch_list(self):
        if not self.is_available():
            return []
        return list(_cfg.get("arch_list", []))

    def get_device_properties(self, i):
        return _Props(_cfg["devices"][i])

    def get_device_name(self, i):
        return _Props(_cfg["devices"][i]).name

    def get_device_capability(self, i):
        p = _Props(_cfg["devices"][i])
        return p.major, p.minor

    def synchronize(self, i=None):
        return None

    def empty_cache(self):
        return None


cuda = _Cuda()


def _cuda_getArchFlags():
    return " ".join(_cfg.get("arch_list", [])) or None


_C = types.SimpleNamespace()
if not _cfg.get("no_arch_flags"):
    _C._cuda_getArchFlags = _cuda_getArchFlags
backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=False)))
