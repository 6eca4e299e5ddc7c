"""gpupin torch probe: prove that this image's PyTorch computes on every visible GPU.

gpupin bind-mounts this file read-only into the candidate image and runs it
with python3. It prints exactly one line, "GPUPIN-PROBE {json}", and exits 0
only when every GPU passed. It needs no network and writes only under /tmp.

Per GPU: the device's compute capability must be reachable from
torch.cuda.get_arch_list() (SASS for the same major and a lower or equal
minor, or PTX for an equal or lower capability); a bf16 matmul must match a
float32 reference within MATMUL_REL_TOL; its speed is measured. If
GPUPIN_ENGINE names vllm or sglang, the engine and its compiled extension are
imported too, because extension modules that do not load on this driver are
the failure users actually hit.
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


def device_uuid(props):
    u = getattr(props, "uuid", None)
    if u is None:
        return ""
    u = str(u)
    if u and not u.startswith(("GPU-", "MIG-")):
        u = "GPU-" + u
    return u


def probe_device(torch, i, arch_list):
    dev = {"index": i, "uuid": "", "name": "", "cc": "", "tflops": 0.0, "max_abs_err": 0.0}
    try:
        props = torch.cuda.get_device_properties(i)
        dev["name"] = str(getattr(props, "name", "") or torch.cuda.get_device_name(i))
        dev["uuid"] = device_uuid(props)
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


def import_engine(engine, runtime):
    """Import the engine's modules; return an error string or None."""
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
            traceback.print_exc(file=sys.stderr)
            return "import %s: %s: %s" % (mod, type(e).__name__, e)
        loaded.append(mod)
        if mod == mods[0]:
            runtime[engine] = str(getattr(m, "__version__", "unknown"))
    runtime["engine_import"] = " ".join(loaded)
    return None


def run():
    verdict = {"ok": False, "devices": [], "runtime": {"probe": "torch"}, "detail": ""}
    runtime = verdict["runtime"]
    _prepare_env()
    engine = os.environ.get("GPUPIN_ENGINE", "").strip().lower()
    if engine:
        runtime["engine"] = engine

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
