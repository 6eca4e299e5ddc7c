"""gpupin torch probe: prove that this image's PyTorch computes on every visible GPU.

gpupin bind-mounts this file read-only into the candidate image and runs it
with python3. It prints exactly one line, "GPUPIN-PROBE {json}", and exits 0
only when every GPU passed. It needs no network and writes only under /tmp.

Per GPU: its UUID, as NVML prints it (gpupin matches GPUs by it; a device
whose UUID cannot be read fails); the device's compute capability must be reachable from
torch.cuda.get_arch_list() (SASS for the same major and a lower or equal
minor, or PTX for an equal or lower capability); a bf16 matmul must match a
float32 reference within MATMUL_REL_TOL; its speed is measured. If
GPUPIN_ENGINE names vllm or sglang, the engine and its compiled extension are
imported too, because extension modules that do not load on this driver are
the failure users actually hit.

With GPUPIN_SIMULATED=1 (a node without a GPU) it checks what needs no
device, for the GPUs gpupin describes in GPUPIN_SIM_DEVICES: torch imports
and has CUDA, torch.version.cuda agrees with the variant's CUDA
(GPUPIN_SIM_VARIANT_CUDA) and is supported by the simulated driver
(GPUPIN_SIM_NODE_CUDA), the build's arch list reaches every GPU, and the
engine imports; it names what it could not check in "simulated_checks".
"""

import json
import math
import os
import sys
import time
import traceback

PREFIX = "GPUPIN-PROBE "

# Matrices are N x N: 4096 takes ~0.2 ms per matmul on an H200 and well under
# a second on the slowest supported GPUs; TIMED_ITERS makes the timed run a few ms.
N = 4096
WARMUP_ITERS = 3
TIMED_ITERS = 20

# A bf16 result has 8 significant bits, so each element carries up to 2^-9
# relative rounding error, and cuBLAS may reduce split-K partials in bf16.
# 2% of the largest reference magnitude leaves room for both while any wrong
# kernel (garbage, zeros, NaN, a transposed operand) misses by far more.
MATMUL_REL_TOL = 0.02

# Engines whose import is part of the proof: the package, then its compiled
# extension. An extension missing from this engine version is skipped; one
# that fails to load fails the probe.
ENGINE_MODULES = {
    "vllm": ["vllm", "vllm._C"],
    "sglang": ["sglang", "sgl_kernel"],
}

# Libraries that come with the node's driver (the GPU injection mounts them):
# on a simulated node, an import that fails for want of one of them is what
# a node without a GPU looks like, not a broken image.
DRIVER_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")


def _prepare_env():
    # Point every cache at /tmp and keep libraries offline: the root
    # filesystem is read-only and the container has no network.
    sys.dont_write_bytecode = True
    cache = "/tmp/gpupin-probe-cache"
    for key, value in (
        ("HOME", "/tmp"),  # only where the image sets none
        ("XDG_CACHE_HOME", cache),
        ("TRITON_CACHE_DIR", cache + "/triton"),
        ("TORCHINDUCTOR_CACHE_DIR", cache + "/inductor"),
        ("VLLM_CACHE_ROOT", cache + "/vllm"),
        ("HF_HOME", cache + "/hf"),
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("VLLM_NO_USAGE_STATS", "1"),
        ("DO_NOT_TRACK", "1"),
    ):
        os.environ.setdefault(key, value)
    if not os.access(os.environ["HOME"], os.W_OK):
        os.environ["HOME"] = "/tmp"


def parse_arch(entry):
    """'sm_90' -> ('sm', 9, 0, ''); 'compute_100a' -> ('compute', 10, 0, 'a'); else None."""
    kind, sep, rest = entry.partition("_")
    if not sep or kind not in ("sm", "compute"):
        return None
    suffix = ""
    if rest and rest[-1] in "af":
        rest, suffix = rest[:-1], rest[-1]
    if len(rest) < 2 or not rest.isdigit():
        return None
    return kind, int(rest[:-1]), int(rest[-1]), suffix


def arch_match(cc, arch_list):
    """How a device of capability cc (major, minor) runs this build, or None.

    SASS (sm_XY) runs on the same major with an equal or higher minor, except
    arch-specific 'a' builds, which run only on exactly XY. PTX (compute_XY)
    is JIT-compiled by the driver for any equal or higher capability.
    """
    major, minor = cc
    sass, ptx = None, None
    for entry in arch_list:
        p = parse_arch(entry)
        if p is None:
            continue
        kind, amaj, amin, suffix = p
        if kind == "sm":
            if (amaj, amin) == (major, minor):
                return entry
            if suffix != "a" and amaj == major and amin < minor:
                if sass is None or parse_arch(sass)[2] < amin:
                    sass = entry
        elif suffix == "a":
            if (amaj, amin) == (major, minor) and ptx is None:
                ptx = entry
        elif (amaj, amin) <= (major, minor):
            if ptx is None or parse_arch(ptx)[1:3] < (amaj, amin):
                ptx = entry
    if sass is not None:
        return sass
    if ptx is not None:
        return ptx + " (PTX JIT)"
    return None


def finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def format_uuid(raw):
    """16 bytes as NVML prints a GPU's UUID: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = bytes(raw).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


def device_uuid(i, props):
    """GPU i's UUID, as NVML prints it; raises when it cannot be read.

    gpupin matches the GPUs a probe computed on to the node's by UUID, so
    a device the probe cannot name fails. PyTorch 2.x has it in the
    device properties; older builds do not, and then the driver that torch
    has already loaded is asked (cuDeviceGetUuid_v2, else cuDeviceGetUuid).
    """
    u = getattr(props, "uuid", None)
    if u is not None and str(u):
        u = str(u)
        if not u.startswith(("GPU-", "MIG-")):
            u = "GPU-" + u
        return u
    return driver_uuid(i)


def driver_uuid(i):
    import ctypes

    why = "torch has no device uuid (PyTorch < 2), and "
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError("cannot read GPU %d's UUID: %slibcuda.so.1 does not load: %s" % (i, why, e))
    for name in ("cuDeviceGetUuid_v2", "cuDeviceGetUuid"):
        get_uuid = getattr(lib, name, None)  # None when the symbol is missing
        if get_uuid is not None:
            break
    else:
        raise RuntimeError("cannot read GPU %d's UUID: %slibcuda.so.1 has neither cuDeviceGetUuid_v2 nor cuDeviceGetUuid" % (i, why))

    def check(call, code):
        if code != 0:
            raise RuntimeError("cannot read GPU %d's UUID: %s failed with CUresult %d" % (i, call, code))

    dev = ctypes.c_int()
    raw = (ctypes.c_ubyte * 16)()
    check("cuInit", lib.cuInit(0))  # torch initialised the driver already; again is harmless
    check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(dev), i))
    check(name, get_uuid(raw, dev))
    return format_uuid(raw)


def probe_device(torch, i, arch_list):
    dev = {"index": i, "uuid": "", "name": "", "cc": "", "tflops": 0.0, "max_abs_err": 0.0}
    try:
        props = torch.cuda.get_device_properties(i)
        dev["name"] = str(getattr(props, "name", "") or torch.cuda.get_device_name(i))
        dev["uuid"] = device_uuid(i, props)
        major, minor = torch.cuda.get_device_capability(i)
        dev["cc"] = "%d.%d" % (major, minor)

        how = arch_match((major, minor), arch_list)
        if how is None:
            dev["ok"] = False
            dev["detail"] = (
                "this torch build has no kernels for sm_%d%d (compute capability %s); "
                "its arch list is %s" % (major, minor, dev["cc"], " ".join(arch_list) or "empty")
            )
            return dev

        name = "cuda:%d" % i
        torch.manual_seed(1234 + i)
        a = torch.randn((N, N), device=name, dtype=torch.bfloat16)
        b = torch.randn((N, N), device=name, dtype=torch.bfloat16)
        c = a @ b
        ref = a.float() @ b.float()
        torch.cuda.synchronize(i)
        err = (c.float() - ref).abs().max().item()
        scale = ref.abs().max().item()

        for _ in range(WARMUP_ITERS):
            c = a @ b
        torch.cuda.synchronize(i)
        t0 = time.perf_counter()
        for _ in range(TIMED_ITERS):
            c = a @ b
        torch.cuda.synchronize(i)
        elapsed = time.perf_counter() - t0
        flops = 2.0 * N * N * N * TIMED_ITERS
        dev["tflops"] = round(flops / elapsed / 1e12, 3) if elapsed > 0 else 0.0

        dev["max_abs_err"] = finite(err)
        limit = MATMUL_REL_TOL * scale if math.isfinite(scale) else float("nan")
        if not (math.isfinite(err) and math.isfinite(scale) and scale > 0):
            dev["ok"] = False
            dev["detail"] = "bf16 matmul gave a non-finite or zero result (max |err| %r, max |ref| %r)" % (err, scale)
        elif err > limit:
            dev["ok"] = False
            dev["detail"] = (
                "bf16 matmul does not match the float32 reference: max |err| %.4g > %.4g "
                "(%g of max |ref| %.4g)" % (err, limit, MATMUL_REL_TOL, scale)
            )
        else:
            dev["ok"] = True
            dev["detail"] = "kernels: %s" % how
        del a, b, c, ref
        try:
            torch.cuda.empty_cache()
        except Exception:
            pass
    except Exception as e:  # a device that raises fails alone; the others still run
        traceback.print_exc(file=sys.stderr)
        dev["ok"] = False
        dev["detail"] = "%s: %s" % (type(e).__name__, e)
    return dev


def driver_lib_missing(e):
    """The driver library an import error names as missing, or None."""
    msg = str(e)
    for lib in DRIVER_LIBS:
        if lib in msg:
            return lib
    return None


def import_engine(engine, runtime, simulated=None):
    """Import the engine's modules; return an error string or None.

    With simulated (a list), an import that fails only for want of the
    driver's libraries is recorded there instead of failing.
    """
    import importlib

    mods = ENGINE_MODULES.get(engine)
    if mods is None:
        runtime["engine_import"] = "skipped: no import check for engine %r" % engine
        return None
    loaded = []
    for mod in mods:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            # Only the optional extension may be absent, and only itself.
            if mod != mods[0] and e.name == mod:
                continue
            traceback.print_exc(file=sys.stderr)
            return "import %s: %s: %s" % (mod, type(e).__name__, e)
        except BaseException as e:
            lib = driver_lib_missing(e) if simulated is not None else None
            if lib is not None:
                simulated.append("import %s (it needs %s, which comes with the node's driver)" % (mod, lib))
                # What follows the module would not load either.
                break
            traceback.print_exc(file=sys.stderr)
            return "import %s: %s: %s" % (mod, type(e).__name__, e)
        loaded.append(mod)
        if mod == mods[0]:
            runtime[engine] = str(getattr(m, "__version__", "unknown"))
    runtime["engine_import"] = " ".join(loaded)
    return None


def major_minor(v):
    """'12.9' / '12.9.1' / '13' -> (12, 9) / (12, 9) / (13, 0); None if not a version."""
    parts = str(v or "").strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


def read_arch_list(torch):
    """The build's CUDA arch list without touching a device, and where it came from.

    torch.cuda.get_arch_list() answers [] when no GPU is available, so the
    compile-time flags it reads are asked for directly first.
    """
    flags = getattr(getattr(torch, "_C", None), "_cuda_getArchFlags", None)
    if flags is not None:
        try:
            got = flags()
            if got:
                return str(got).split(), "torch._C._cuda_getArchFlags()"
        except Exception:
            traceback.print_exc(file=sys.stderr)
    try:
        return list(torch.cuda.get_arch_list()), "torch.cuda.get_arch_list()"
    except Exception:
        traceback.print_exc(file=sys.stderr)
        return [], "torch.cuda.get_arch_list()"


def run_simulated(verdict, engine):
    """The probe on a simulated node: every check that needs no device."""
    runtime = verdict["runtime"]
    runtime["simulated"] = True
    simulated = []
    verdict["simulated_checks"] = simulated
    try:
        devices = json.loads(os.environ.get("GPUPIN_SIM_DEVICES") or "[]")
    except ValueError as e:
        verdict["detail"] = "GPUPIN_SIM_DEVICES is not JSON: %s" % e
        return verdict
    if not isinstance(devices, list) or not devices:
        verdict["detail"] = "simulated node, but GPUPIN_SIM_DEVICES holds no devices"
        return verdict

    import torch

    runtime["torch"] = str(getattr(torch, "__version__", "unknown"))
    runtime["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    if not runtime["cuda"]:
        verdict["detail"] = "this torch build has no CUDA support (torch.version.cuda is empty)"
        return verdict
    problems = []
    built = major_minor(runtime["cuda"])
    variant = os.environ.get("GPUPIN_SIM_VARIANT_CUDA", "").strip()
    node = os.environ.get("GPUPIN_SIM_NODE_CUDA", "").strip()
    if variant:
        runtime["variant_cuda"] = variant
    if built is None:
        problems.append("torch.version.cuda %r is not a version" % runtime["cuda"])
    elif major_minor(variant) is not None and major_minor(variant) != built:
        problems.append(
            "torch is built for CUDA %s, but the variant says CUDA %s (io.gpupin.cuda.version): "
            "the choice was made for a CUDA this image does not have" % (runtime["cuda"], variant)
        )
    elif major_minor(node) is not None and built > major_minor(node):
        # What torch.cuda.is_available() would say on that driver.
        problems.append(
            "torch is built for CUDA %s and the simulated driver supports CUDA %s: "
            "on that node the NVIDIA driver would be too old" % (runtime["cuda"], node)
        )
    if not variant:
        runtime["variant_cuda"] = "unknown: not compared"

    arch_list, source = read_arch_list(torch)
    runtime["arch_list"] = " ".join(arch_list)
    runtime["arch_list_from"] = source
    failed = 0
    for i, d in enumerate(devices):
        d = d if isinstance(d, dict) else {}
        dev = {
            "index": int(d.get("index", i)),
            "uuid": str(d.get("uuid", "")),
            "name": str(d.get("name", "")),
            "cc": str(d.get("cc", "")),
            "tflops": 0.0,
            "max_abs_err": 0.0,
        }
        cc = major_minor(dev["cc"])
        if not arch_list:
            dev["ok"] = True
            dev["detail"] = "simulated: torch reports no arch list without a GPU; no matmul run"
        elif cc is None:
            dev["ok"] = False
            dev["detail"] = "the simulated GPU has no compute capability (cc %r)" % dev["cc"]
        else:
            how = arch_match(cc, arch_list)
            if how is None:
                dev["ok"] = False
                dev["detail"] = "this torch build has no kernels for sm_%d%d (compute capability %s); its arch list is %s" % (
                    cc[0], cc[1], dev["cc"], " ".join(arch_list))
            else:
                dev["ok"] = True
                dev["detail"] = "kernels: %s; simulated: no matmul run" % how
        if not dev["ok"]:
            failed += 1
        verdict["devices"].append(dev)
    if not arch_list:
        simulated.append("the arch list's reach of each GPU (torch reports no arch list without a GPU)")
    if failed:
        problems.append("%d of %d GPUs failed" % (failed, len(devices)))
    simulated.append("CUDA driver initialisation and the GPUs torch sees")
    simulated.append("bf16 matmul against a float32 reference, and its speed, on each GPU")

    engine_err = import_engine(engine, runtime, simulated) if engine else None
    if engine_err:
        problems.append("engine %s does not load: %s" % (engine, engine_err))

    verdict["ok"] = not problems
    if problems:
        verdict["detail"] = "; ".join(problems)
    else:
        verdict["detail"] = "simulated node: torch %s (CUDA %s) imports and reaches %d GPUs by its arch list; the device work is simulated" % (
            runtime["torch"], runtime["cuda"], len(devices))
    return verdict


def run():
    verdict = {"ok": False, "devices": [], "runtime": {"probe": "torch"}, "detail": ""}
    runtime = verdict["runtime"]
    _prepare_env()
    engine = os.environ.get("GPUPIN_ENGINE", "").strip().lower()
    if engine:
        runtime["engine"] = engine
    if os.environ.get("GPUPIN_SIMULATED") == "1":
        return run_simulated(verdict, engine)

    import warnings

    import torch

    runtime["torch"] = str(getattr(torch, "__version__", "unknown"))
    runtime["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    if not runtime["cuda"]:
        verdict["detail"] = "this torch build has no CUDA support (torch.version.cuda is empty)"
        return verdict

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    if count == 0:
        reason = "; ".join(str(w.message) for w in caught)
        try:
            torch.cuda.init()
        except Exception as e:
            reason = reason or "%s: %s" % (type(e).__name__, e)
        verdict["detail"] = "no CUDA devices visible to torch" + (": " + reason if reason else "")
        return verdict

    try:
        driver = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
    except Exception:
        driver = None
    if driver:
        runtime["driver_cuda"] = "%d.%d" % (driver // 1000, (driver % 1000) // 10)
    try:
        # The float32 reference must be full float32, not TF32.
        torch.backends.cuda.matmul.allow_tf32 = False
    except Exception:
        pass
    arch_list = list(torch.cuda.get_arch_list())
    runtime["arch_list"] = " ".join(arch_list)
    runtime["matmul"] = "bf16 %dx%d, tolerance %g of max |ref|" % (N, N, MATMUL_REL_TOL)

    for i in range(count):
        verdict["devices"].append(probe_device(torch, i, arch_list))
    failed = [d for d in verdict["devices"] if not d.get("ok")]

    engine_err = import_engine(engine, runtime) if engine else None

    problems = []
    if failed:
        problems.append("%d of %d GPUs failed" % (len(failed), count))
    if engine_err:
        problems.append("engine %s does not load: %s" % (engine, engine_err))
    verdict["ok"] = not problems
    verdict["detail"] = "; ".join(problems) if problems else "%d GPUs passed" % count
    return verdict


def emit(verdict):
    line = PREFIX + json.dumps(verdict, allow_nan=False, separators=(",", ":"), default=str)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    try:
        verdict = run()
    except BaseException as e:  # anything, even SystemExit from an import, is a failed probe
        traceback.print_exc(file=sys.stderr)
        verdict = {
            "ok": False,
            "devices": [],
            "runtime": {"probe": "torch"},
            "detail": "probe crashed: %s: %s" % (type(e).__name__, e),
        }
    try:
        emit(verdict)
    except Exception as e:
        emit({"ok": False, "devices": [], "detail": "cannot encode verdict: %s" % e})
        verdict["ok"] = False
    sys.stderr.flush()
    # Skip interpreter shutdown: engine threads and CUDA teardown can hang or
    # crash there and turn a printed verdict into a different exit code.
    os._exit(0 if verdict.get("ok") else 1)


if __name__ == "__main__":
    main()
