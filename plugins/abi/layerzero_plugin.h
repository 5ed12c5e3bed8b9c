/* LayerZero plugin C ABI, version 1 (the Rust crate layerzero-plugin-abi says the same).
 *
 * A plugin is a shared library exporting the three functions below. Its capabilities are a
 * JSON document of LayerZero's capabilities schema (schemas/capabilities.schema.json) with one
 * backend: the backend name is the plugin's name, its `version` MAJOR.MINOR.PATCH, and every
 * kernel id `NAME.OP.VARIANT`. Loaded, its kernels live in the namespace NAME@VERSION
 * (`fusedops@0.1.0.rms_norm.add_fused`), so two versions load side by side.
 *
 * No exception or panic may cross these functions: catch your own and return an error status.
 * A plugin that aborts takes the host process with it; run such a backend isolated in a
 * worker process.
 */
#ifndef LZ_PLUGIN_ABI_H
#define LZ_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#define LZ_PLUGIN_ABI_VERSION 1u

/* Element types (stable codes). */
enum {
    LZ_DTYPE_F32 = 0, LZ_DTYPE_F16 = 1, LZ_DTYPE_BF16 = 2, LZ_DTYPE_FP8_E4M3 = 3,
    LZ_DTYPE_FP8_E5M2 = 4, LZ_DTYPE_I8 = 5, LZ_DTYPE_I32 = 6, LZ_DTYPE_I64 = 7, LZ_DTYPE_BOOL = 8
};
/* Device kinds. */
enum { LZ_DEVICE_CPU = 0, LZ_DEVICE_CUDA = 1, LZ_DEVICE_ROCM = 2 };
/* Kernel status codes. */
enum { LZ_OK = 0, LZ_INVALID_INPUT = 1, LZ_FAILED = 2, LZ_PANICKED = 3 };

/* A tensor: ndim sizes and strides (in elements). */
typedef struct lz_tensor {
    void *data;
    uint32_t dtype;
    uint32_t device;
    int32_t device_index;
    uint32_t ndim;
    const int64_t *shape;
    const int64_t *strides;
} lz_tensor;

/* A named input ("x", "residual", "weight", ... as the op names them). Inputs are read-only. */
typedef struct lz_arg {
    const char *name;
    lz_tensor tensor;
} lz_arg;

/* Asks the host for output `name` ("out", "residual_out", ...) of `dtype` and `shape`; on
 * LZ_OK, `out` describes a contiguous buffer the kernel writes. The buffer is the host's. */
typedef int32_t (*lz_alloc_fn)(void *host, const char *name, uint32_t dtype, uint32_t ndim,
                               const int64_t *shape, lz_tensor *out);

/* A kernel: inputs, attributes as a JSON object, the host's allocator, and `error_len` bytes
 * for a NUL-terminated message. Returns an LZ_* status. Called on the host's thread; the host
 * may call it from several threads at once. */
typedef int32_t (*lz_kernel_fn)(const lz_arg *inputs, size_t n_inputs, const char *attrs_json,
                                void *host, lz_alloc_fn alloc, char *error, size_t error_len);

uint32_t lz_plugin_abi_version(void);
/* NUL-terminated, alive while the library is loaded. */
const char *lz_plugin_capabilities(void);
/* The entry point of a kernel the capabilities declare (by its `NAME.OP.VARIANT` id), or NULL. */
lz_kernel_fn lz_plugin_kernel(const char *kernel_id);

#endif
