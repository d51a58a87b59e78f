/* A stand-in for libcuda.so.1 (there is no GPU here): the driver API calls flightrec.cuda.driver makes,
 * with host memory as "device" memory. Kernels do not run, except "fill" (out[i] = value + i), which
 * checks how arguments are packed; every launch's grid and block are kept for fake_last_launch().
 * FAKE_CUDA_INIT_ERROR=1 makes cuInit fail as on a machine whose GPU is not visible. Tests only. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
enum { OK = 0, OUT_OF_MEMORY = 2, NO_DEVICE = 100, INVALID_DEVICE = 101, INVALID_IMAGE = 200, NOT_FOUND = 500 };

static int ctx_depth = 0;
static int ctx_token = 42;
static unsigned last_launch[7];
static unsigned launches = 0;

CUresult cuGetErrorName(CUresult e, const char **s) {
    switch (e) {
    case OK: *s = "CUDA_SUCCESS"; break;
    case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
    case INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
    case NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    default: *s = 0; return 1;
    }
    return OK;
}

CUresult cuGetErrorString(CUresult e, const char **s) {
    switch (e) {
    case OUT_OF_MEMORY: *s = "out of memory"; break;
    case NO_DEVICE: *s = "no CUDA-capable device is detected"; break;
    case INVALID_IMAGE: *s = "device kernel image is invalid"; break;
    case NOT_FOUND: *s = "named symbol not found"; break;
    default: *s = "unknown error"; break;
    }
    return OK;
}

/* NVRTC itself opens libcuda.so.1 and asks for this; a driver without the table makes it go on alone. */
CUresult cuGetExportTable(const void **table, const void *id) { (void)id; *table = 0; return NOT_FOUND; }

CUresult cuInit(unsigned flags) { (void)flags; return getenv("FAKE_CUDA_INIT_ERROR") ? NO_DEVICE : OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal != 0) return INVALID_DEVICE; *d = 0; return OK; }
CUresult cuDeviceGetName(char *name, int len, int d) { (void)d; strncpy(name, "Fake H200", len); return OK; }

CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
    (void)d;
    switch (attr) {
    case 16: *v = 132; break;        /* multiprocessors */
    case 36: *v = 3201000; break;    /* memory clock, kHz */
    case 37: *v = 6144; break;       /* bus width, bits */
    case 75: *v = 9; break;
    case 76: *v = 0; break;
    default: *v = 0;
    }
    return OK;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, int d) { (void)d; *bytes = (size_t)141 << 30; return OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) { (void)d; *ctx = &ctx_token; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return OK; }
CUresult cuCtxPushCurrent_v2(void *ctx) { if (ctx != &ctx_token) return INVALID_DEVICE; ctx_depth++; return OK; }
CUresult cuCtxPopCurrent_v2(void **ctx) { *ctx = &ctx_token; ctx_depth--; return OK; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return OK; }
CUresult cuCtxSynchronize(void) { return OK; }
int fake_context_depth(void) { return ctx_depth; }

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) { *free_b = (size_t)140 << 30; *total = (size_t)141 << 30; return OK; }

CUresult cuMemAlloc_v2(uint64_t *ptr, size_t n) {
    if (n > ((size_t)1 << 32)) return OUT_OF_MEMORY;
    void *p = calloc(1, n ? n : 1);
    if (!p) return OUT_OF_MEMORY;
    *ptr = (uint64_t)(uintptr_t)p;
    return OK;
}

CUresult cuMemFree_v2(uint64_t ptr) { free((void *)(uintptr_t)ptr); return OK; }
CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return OK; }
CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return OK; }
CUresult cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n) {
    memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
    return OK;
}

CUresult cuModuleLoadData(void **mod, const void *image) {
    if (memcmp(image, "\x7f" "ELF", 4) != 0) return INVALID_IMAGE;
    *mod = (void *)image;
    return OK;
}

CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
    (void)mod;
    if (strcmp(name, "missing") == 0) return NOT_FOUND;
    *fn = strdup(name);
    return OK;
}

CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem, void *stream, void **params, void **extra) {
    (void)stream; (void)extra;
    unsigned dims[7] = {gx, gy, gz, bx, by, bz, shmem};
    memcpy(last_launch, dims, sizeof dims);
    launches++;
    if (strcmp((const char *)fn, "fill") == 0) {
        uint64_t *out = (uint64_t *)(uintptr_t)(*(uint64_t *)params[0]);
        uint64_t value = *(uint64_t *)params[1];
        uint32_t count = *(uint32_t *)params[2];
        for (uint32_t i = 0; i < count; i++) out[i] = value + i;
    }
    return OK;
}

unsigned fake_last_launch(unsigned *dims) { memcpy(dims, last_launch, sizeof last_launch); return launches; }

typedef struct { double at_ms; } event;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

CUresult cuEventCreate(void **ev, unsigned flags) { (void)flags; *ev = calloc(1, sizeof(event)); return OK; }
CUresult cuEventRecord(void *ev, void *stream) { (void)stream; ((event *)ev)->at_ms = now_ms(); return OK; }
CUresult cuEventSynchronize(void *ev) { (void)ev; return OK; }
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { *ms = (float)(((event *)b)->at_ms - ((event *)a)->at_ms); return OK; }
CUresult cuEventDestroy_v2(void *ev) { free(ev); return OK; }
