/*
 * A stand-in libcuda.so.1 for testing gpupin-cuda-probe without a GPU.
 * GPUPIN_FAKE_CUDA picks its behaviour:
 *   init100   cuInit fails with CUDA_ERROR_NO_DEVICE (100)
 *   zero      cuInit succeeds, no devices
 *   ok        two devices; kernels run on the host and compute saxpy
 *   corrupt   as ok, but device 1 gets one element wrong
 *   badptx    as ok, but loading the PTX fails on device 1 with 218 (INVALID_PTX)
 *             and a JIT log
 *   nouuid    as ok, but reading device 1's UUID fails with 801 (NOT_SUPPORTED)
 * With -DNO_LOAD_EX it lacks cuModuleLoadDataEx, as old drivers might.
 * With -DOLD_UUID it has cuDeviceGetUuid but not cuDeviceGetUuid_v2, as
 * drivers before CUDA 11.4 (the same bytes: no MIG here).
 * Built with -DONLY_INIT it exports cuInit alone (a library too old or foreign).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static const char *mode(void) {
	const char *m = getenv("GPUPIN_FAKE_CUDA");
	return m ? m : "ok";
}
static int is(const char *m) { return strcmp(mode(), m) == 0; }

CUresult cuInit(unsigned flags) {
	if (flags != 0) return 1;
	return is("init100") ? 100 : 0;
}

#ifndef ONLY_INIT
static int current = -1; /* device of the current context */

CUresult cuGetErrorName(CUresult code, const char **name) {
	/* Only some codes: the probe must fall back to its own table for the rest. */
	if (code == 100) { *name = "CUDA_ERROR_NO_DEVICE"; return 0; }
	return 1;
}

CUresult cuDriverGetVersion(int *v) { *v = 12090; return 0; }

CUresult cuDeviceGetCount(int *n) { *n = is("zero") ? 0 : 2; return 0; }

CUresult cuDeviceGet(int *dev, int ordinal) {
	if (ordinal < 0 || ordinal > 1) return 101;
	*dev = ordinal;
	return 0;
}

CUresult cuDeviceGetName(char *name, int len, int dev) {
	const char *n = dev == 0 ? "Fake H200" : "Fake L4";
	if (len < (int)strlen(n) + 1) return 1;
	strcpy(name, n);
	return 0;
}

#ifdef OLD_UUID
CUresult cuDeviceGetUuid(unsigned char *uuid, int dev) {
#else
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, int dev) {
#endif
	if (dev < 0 || dev > 1) return 101;
	if (is("nouuid") && dev == 1) return 801;
	for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(0x10 * dev + i);
	return 0;
}

CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
	if (attr == 75) { *v = dev == 0 ? 9 : 8; return 0; }
	if (attr == 76) { *v = dev == 0 ? 0 : 9; return 0; }
	return 1;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)(long)(dev + 1); return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { current = (int)(long)ctx - 1; return 0; }
CUresult cuCtxSynchronize(void) { return current < 0 ? 201 : 0; }

static int module_token;
CUresult cuModuleLoadData(void **mod, const void *image) {
	if (current < 0) return 201;
	if (is("badptx") && current == 1) return 218;
	/* The probe's PTX must name its kernel and a low target. */
	if (!strstr(image, ".entry gpupin_saxpy(") || !strstr(image, ".target sm_50")) return 218;
	*mod = &module_token;
	return 0;
}
#ifndef NO_LOAD_EX
/* Writes a JIT log on failure, as the driver does, through the option arrays. */
CUresult cuModuleLoadDataEx(void **mod, const void *image, unsigned n, int *options, void **values) {
	CUresult r = cuModuleLoadData(mod, image);
	if (r == 0) return 0;
	char *buf = 0;
	size_t size = 0;
	for (unsigned i = 0; i < n; i++) {
		if (options[i] == 5) buf = values[i];
		if (options[i] == 6) size = (size_t)values[i];
	}
	if (buf && size > 0) {
		snprintf(buf, size, "ptxas fatal   : Unsupported .version %s", "5.0");
	}
	return r;
}
#endif

CUresult cuModuleUnload(void *mod) { return mod == &module_token ? 0 : 400; }

static int function_token;
CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
	if (mod != &module_token) return 400;
	if (strcmp(name, "gpupin_saxpy") != 0) return 500;
	*fn = &function_token;
	return 0;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	void *m = malloc(n);
	if (!m) return 2;
	*p = (CUdeviceptr)m;
	return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)p); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { memcpy((void *)dst, src, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { memcpy(dst, (void *)src, n); return 0; }

/* Runs the kernel on the host, reading its arguments the way the driver does. */
CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz,
                        unsigned bx, unsigned by, unsigned bz, unsigned shared,
                        void *stream, void **params, void **extra) {
	if (fn != &function_token || current < 0) return 400;
	if (gy != 1 || gz != 1 || by != 1 || bz != 1 || shared != 0 || stream || extra || !params) return 1;
	unsigned n = *(unsigned *)params[0];
	float a = *(float *)params[1];
	float *x = (float *)*(CUdeviceptr *)params[2];
	float *y = (float *)*(CUdeviceptr *)params[3];
	float *out = (float *)*(CUdeviceptr *)params[4];
	if ((unsigned long long)gx * bx < n) return 1;
	for (unsigned i = 0; i < n; i++) out[i] = a * x[i] + y[i];
	if (is("corrupt") && current == 1 && n > 12345) out[12345] += 1.0f;
	return 0;
}
#endif
