/*
 * The `_cpu_kernels` extension module: decode kernels for x86-64 CPUs with AVX2 and FMA (the small-batch matmul in
 * linear.c, decode attention over the paged KV pool in attention.c and attention_wide.c, the K/V store and a decoder
 * layer's elementwise steps in elementwise.c, all of a decode step's decoder layers in one call in decoder.c), a
 * prefill chunk's attention on CPUs with AMX (attention_amx.c), and how they run.
 *
 * Work is split across torch's own OpenMP thread pool: the libgomp that torch loaded is found by the Python side
 * (local_engine.model.cpu_kernels) and bound here with dlopen(RTLD_NOLOAD), and GOMP_parallel, the entry point
 * `#pragma omp parallel` compiles to (GCC's libgomp ABI, also exported by Intel's libiomp5), is called directly.
 * A second OpenMP runtime would give the process a second pool of spinning threads on the same cores.
 *
 * SOURCE_HASH is the hash of the csrc files this module was built from (setup.py computes it with
 * local_engine.model.kernel_extension.source_hash): the Python side refuses a module built from other sources.
 */
#include "cpu_kernels.h"

#include <dlfcn.h>

#ifndef PREFIXSCOPE_KERNELS_SOURCE_HASH
#define PREFIXSCOPE_KERNELS_SOURCE_HASH "unknown" /* built outside setup.py: never matches, so never loaded */
#endif

int avx512_enabled = 0;

uint64_t path_counts[NUM_PATHS];
/* In enum kernel_path's order (cpu_kernels.h). */
static const char *const PATH_NAMES[NUM_PATHS] = {"amx_chunk_attention", "matmul_512",           "matmul_256",
                                                   "decode_layers",       "invariant_matmul",     "invariant_attention"};

static PyObject *py_path_counts(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *counts = PyTuple_New(NUM_PATHS);
    if (counts == NULL) return NULL;
    for (int path = 0; path < NUM_PATHS; path++) {
        PyObject *count = PyLong_FromUnsignedLongLong(__atomic_load_n(&path_counts[path], __ATOMIC_RELAXED));
        if (count == NULL) {
            Py_DECREF(counts);
            return NULL;
        }
        PyTuple_SET_ITEM(counts, path, count);
    }
    return counts;
}

static PyObject *path_names(void) {
    PyObject *names = PyTuple_New(NUM_PATHS);
    for (int path = 0; names != NULL && path < NUM_PATHS; path++) {
        PyObject *name = PyUnicode_FromString(PATH_NAMES[path]);
        if (name == NULL) {
            Py_CLEAR(names);
            break;
        }
        PyTuple_SET_ITEM(names, path, name);
    }
    return names;
}

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_int_fn)(void);

static gomp_parallel_fn gomp_parallel = NULL;
static omp_int_fn omp_thread_num = NULL, omp_num_threads = NULL;

/* Runs fn(data, thread, num_threads) on `threads` threads of the bound pool, or inline on one. */
typedef struct {
    void (*fn)(void *, int, int);
    void *data;
} parallel_call;

static void parallel_trampoline(void *arg) {
    parallel_call *call = (parallel_call *)arg;
    call->fn(call->data, omp_thread_num(), omp_num_threads()); /* the team may be smaller than asked for */
}

void run_parallel(void (*fn)(void *, int, int), void *data, int threads) {
    if (threads <= 1 || gomp_parallel == NULL) {
        fn(data, 0, 1);
        return;
    }
    parallel_call call = {fn, data};
    gomp_parallel(parallel_trampoline, &call, (unsigned)threads, 0);
}

static PyObject *supported(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    __builtin_cpu_init();
    avx512_enabled = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    return PyBool_FromLong(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
}

static PyObject *use_avx512(PyObject *self, PyObject *args) {
    (void)self;
    int enabled;
    if (!PyArg_ParseTuple(args, "p", &enabled)) return NULL;
    __builtin_cpu_init();
    avx512_enabled = enabled && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    return PyBool_FromLong(avx512_enabled);
}

static PyObject *avx512(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(avx512_enabled);
}

static PyObject *amx(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(amx_usable());
}

static PyObject *bind_openmp(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    void *library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL) Py_RETURN_FALSE;
    gomp_parallel_fn parallel = (gomp_parallel_fn)dlsym(library, "GOMP_parallel");
    omp_int_fn thread_num = (omp_int_fn)dlsym(library, "omp_get_thread_num");
    omp_int_fn num_threads = (omp_int_fn)dlsym(library, "omp_get_num_threads");
    if (parallel == NULL || thread_num == NULL || num_threads == NULL) Py_RETURN_FALSE;
    gomp_parallel = parallel;
    omp_thread_num = thread_num;
    omp_num_threads = num_threads;
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"supported", supported, METH_NOARGS, "Whether this CPU has AVX2 and FMA."},
    {"use_avx512", use_avx512, METH_VARARGS, "use_avx512(enabled) -> bool: take the 512-bit paths where the CPU can."},
    {"avx512", avx512, METH_NOARGS, "Whether the 512-bit paths run."},
    {"amx", amx, METH_NOARGS, "Whether chunk_attention runs here (AMX-BF16, granted by the OS)."},
    {"path_counts", py_path_counts, METH_NOARGS, "How many times each path of PATH_NAMES ran, in that order."},
    {"bind_openmp", bind_openmp, METH_VARARGS, "bind_openmp(path) -> bool: use the loaded OpenMP runtime at path."},
    {"linear", py_linear, METH_VARARGS, "linear(x, w, y, rows, n, k, bf16, threads): y = x @ w.T in float32."},
    {"rms_norm", py_rms_norm, METH_VARARGS, "rms_norm(x, w, y, rows, n, eps, bf16): y = RMSNorm(x) * w."},
    {"rotate", py_rotate, METH_VARARGS, "rotate(x, cos, sin, rows, stride, heads, head_dim): rotary, in place."},
    {"silu_mul", py_silu_mul, METH_VARARGS, "silu_mul(gate_up, out, rows, n): out = silu(gate) * up."},
    {"decode_attention", py_decode_attention, METH_VARARGS,
     "decode_attention(q, q_stride, k, v, num_slots, slots, segments, seg_rows, num_seg_rows, out, rows, stride, "
     "num_segments, heads, kv_heads, head_dim, scale, bf16, threads)."},
    {"decode_layers", py_decode_layers, METH_VARARGS,
     "decode_layers(hidden, layers, num_layers, pool_k, pool_v, layer_stride, num_slots, cos, sin, write_slots, slots, "
     "segments, seg_rows, num_seg_rows, stride, num_segments, rows, hidden_size, heads, kv_heads, head_dim, "
     "intermediate, eps, scale, weights_bf16, pool_bf16, threads): a decode step through every decoder layer."},
    {"chunk_workspace", py_chunk_workspace, METH_VARARGS,
     "chunk_workspace(tokens, context, heads, kv_heads, head_dim, threads) -> bytes chunk_attention needs."},
    {"chunk_attention", py_chunk_attention, METH_VARARGS,
     "chunk_attention(q, q_stride, k, v, num_slots, slots, out, out_stride, tokens, context, heads, kv_heads, "
     "head_dim, scale, workspace, workspace_bytes, threads): a prefill chunk's causal attention on AMX."},
    {"panel_linear", py_panel_linear, METH_VARARGS,
     "panel_linear(x, panels, y, rows, n, k, x_stride, y_stride, bf16, threads): y = x @ w.T, batch-invariant."},
    {"invariant_attention", py_invariant_attention, METH_VARARGS,
     "invariant_attention(q, q_stride, k, v, slots, slots_stride, blocks, num_blocks, out, out_stride, heads, "
     "kv_heads, head_dim, longest, scale, bf16, workspace, threads): batch-invariant attention over the pool."},
    {"store_rows", py_store_rows, METH_VARARGS,
     "store_rows(pool, num_slots, src, src_stride, slots, rows, width, bf16): the step's new K or V into the pool."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cpu_kernels(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *names = path_names();
    /* PyModule_AddObjectRef fails on a NULL names tuple too, with its error set. */
    const int failed = PyModule_AddIntConstant(m, "CHUNK_HEAD_DIM_STEP", CHUNK_HEAD_DIM_STEP) < 0 ||
                       PyModule_AddIntConstant(m, "CHUNK_MAX_HEAD_DIM", CHUNK_MAX_HEAD_DIM) < 0 ||
                       PyModule_AddIntConstant(m, "INVARIANT_PANEL", INVARIANT_PANEL) < 0 ||
                       PyModule_AddIntConstant(m, "INVARIANT_QUERY_BLOCK", INVARIANT_QUERY_BLOCK) < 0 ||
                       PyModule_AddStringConstant(m, "SOURCE_HASH", PREFIXSCOPE_KERNELS_SOURCE_HASH) < 0 ||
                       PyModule_AddObjectRef(m, "PATH_NAMES", names) < 0;
    Py_XDECREF(names);
    if (failed) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
