/* A LayerZero plugin written in C, compiled by tests/tests/plugins.rs in variants (-D flags)
 * that each break one rule of the plugin ABI, to check that every one is refused or
 * contained. Without flags it is a well-behaved plugin: `cplug.rms_norm.c` (f32, contiguous,
 * no residual). Flags: -DCPLUG_VERSION='"0.2.0"', -DCPLUG_NAME='"cpu"', -DCPLUG_ABI=2,
 * -DCPLUG_LIE (declares a second kernel it does not export), -DCPLUG_BAD_JSON,
 * -DCPLUG_FAIL (the kernel returns an error status with a message), -DCPLUG_EXTRA (more
 * backend fields, such as `requires`), -DCPLUG_TRAPS (prints to stdout on every call, and
 * when x[0] is -1 aborts, -2 writes through NULL, -3 never returns: what subprocess isolation
 * must contain). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "layerzero_plugin.h"

#ifndef CPLUG_VERSION
#define CPLUG_VERSION "0.1.0"
#endif
#ifndef CPLUG_NAME
#define CPLUG_NAME "cplug"
#endif
#ifndef CPLUG_ABI
#define CPLUG_ABI LZ_PLUGIN_ABI_VERSION
#endif
/* Extra backend fields, e.g. -DCPLUG_EXTRA='"\"requires\": {\"cuda\": \"12\"}, "'. */
#ifndef CPLUG_EXTRA
#define CPLUG_EXTRA ""
#endif

#define KERNEL(ID) \
    "{\"id\": \"" CPLUG_NAME ".rms_norm." ID "\", \"op\": \"rms_norm\", " \
    "\"constraints\": {\"dtypes\": [\"f32\"], \"strides\": \"contiguous\"}, " \
    "\"properties\": {\"deterministic\": true, \"graph_safe\": false, \"needs_jit\": false, \"workspace_bytes\": 0}, " \
    "\"perf\": {\"eff_compute\": 0.2, \"eff_mem\": 0.4, \"launch_ns\": 3000}}"

static const char CAPABILITIES[] =
#ifdef CPLUG_BAD_JSON
    "{\"schema_version\": 1, \"backend\": \"" CPLUG_NAME "\", \"kernels\": [";
#else
    "{\"schema_version\": 1, \"backend\": \"" CPLUG_NAME "\", \"description\": \"A C test plugin.\", "
    "\"device\": \"cpu\", \"version\": \"" CPLUG_VERSION "\", \"execution\": \"external\", " CPLUG_EXTRA "\"kernels\": ["
    KERNEL("c")
#ifdef CPLUG_LIE
    ", " KERNEL("phantom")
#endif
    "]}";
#endif

uint32_t lz_plugin_abi_version(void) { return CPLUG_ABI; }

const char *lz_plugin_capabilities(void) { return CAPABILITIES; }

static void say(char *error, size_t len, const char *text) {
    if (error && len) {
        strncpy(error, text, len - 1);
        error[len - 1] = 0;
    }
}

__attribute__((unused)) static const lz_arg *find(const lz_arg *in, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(in[i].name, name) == 0) return &in[i];
    return 0;
}

static int32_t rms_norm(const lz_arg *inputs, size_t n_inputs, const char *attrs_json, void *host,
                        lz_alloc_fn alloc, char *error, size_t error_len) {
    (void)attrs_json;
#ifdef CPLUG_FAIL
    (void)inputs; (void)n_inputs; (void)host; (void)alloc;
    say(error, error_len, "cplug refuses on purpose");
    return LZ_FAILED;
#else
    const lz_arg *x = find(inputs, n_inputs, "x"), *w = find(inputs, n_inputs, "weight");
    if (!x || !w || find(inputs, n_inputs, "residual")) {
        say(error, error_len, "cplug takes x and weight, no residual");
        return LZ_INVALID_INPUT;
    }
    const lz_tensor *t = &x->tensor;
    int64_t h = t->shape[t->ndim - 1], n = 1;
    for (uint32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
    lz_tensor out;
    if (alloc(host, "out", LZ_DTYPE_F32, t->ndim, t->shape, &out) != LZ_OK) {
        say(error, error_len, "the host refused the output");
        return LZ_FAILED;
    }
    const float *xs = (const float *)t->data, *ws = (const float *)w->tensor.data;
#ifdef CPLUG_TRAPS
    printf("cplug writes to stdout, which must not reach the host's protocol\n");
    fflush(stdout);
    if (xs[0] == -1.0f) abort();
    if (xs[0] == -2.0f) *(volatile int *)(size_t)xs[1] = 1;
    if (xs[0] == -3.0f)
        for (;;) sleep(1);
#endif
    float *o = (float *)out.data;
    for (int64_t r = 0; r < n / h; r++) {
        double ss = 0;
        for (int64_t i = 0; i < h; i++) ss += (double)xs[r * h + i] * xs[r * h + i];
        float scale = (float)(1.0 / sqrt(ss / (double)h + 1e-6));
        for (int64_t i = 0; i < h; i++) o[r * h + i] = xs[r * h + i] * scale * ws[i];
    }
    return LZ_OK;
#endif
}

lz_kernel_fn lz_plugin_kernel(const char *id) {
    if (id && strcmp(id, CPLUG_NAME ".rms_norm.c") == 0) return rms_norm;
    return 0;
}
