/*
 * What the CPU decode kernels' sources share: the vector-ISA attributes, loads that widen bfloat16 to float32, exp,
 * the OpenMP runner and the 512-bit switch (module.c), and the Python entry points each source defines.
 *
 * Every entry point takes raw addresses of contiguous tensors the caller keeps alive (activations float32, weights
 * and pool float32 or bfloat16 as its `bf16` flag says, tables int64), and releases the GIL while it runs.
 */
#ifndef PREFIXSCOPE_CPU_KERNELS_H
#define PREFIXSCOPE_CPU_KERNELS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Runs fn(data, thread, num_threads) on `threads` threads of torch's OpenMP pool, or inline on one (module.c). */
void run_parallel(void (*fn)(void *, int, int), void *data, int threads);

/* Whether the 512-bit paths run: set where the CPU has AVX-512F and BW, or cleared by `use_avx512` (module.c). */
extern int avx512_enabled;

/* How many times each path ran since the module loaded, read from Python as `path_counts()` (names in PATH_NAMES,
   module.c), so tests and the benchmark see which code served a step rather than which could. Counted once per call
   on the calling thread, never inside the threads' loops; relaxed atomics, since Python threads may call kernels at
   once with the GIL released. A new path is an entry here and its name in PATH_NAMES. */
enum kernel_path {
    PATH_AMX_CHUNK_ATTENTION,
    PATH_MATMUL_512,
    PATH_MATMUL_256,
    PATH_DECODE_LAYERS,
    PATH_INVARIANT_MATMUL,
    PATH_INVARIANT_ATTENTION,
    NUM_PATHS
};
extern uint64_t path_counts[NUM_PATHS];
static inline void count_path(enum kernel_path path) { __atomic_fetch_add(&path_counts[path], 1, __ATOMIC_RELAXED); }

#define AVX2 __attribute__((target("avx2,fma")))
/* Specialised at each call for a constant `bf16`: one copy of a kernel per storage dtype. */
#define AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline
#define AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma")))
#define AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx2,fma"), always_inline)) static inline

AVX2 static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight float32 values from element i of an array stored in float32 or in bfloat16 (a float32's upper 16 bits, so
   widening is exact: zero-extend, shift left by 16). */
AVX2_INLINE __m256 load8(const void *base, int64_t i, const int bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)base + i);
    const __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

static inline float load1(const void *base, int64_t i, const int bf16) {
    if (!bf16) return ((const float *)base)[i];
    const uint32_t bits = (uint32_t)((const uint16_t *)base)[i] << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* Where element i of such an array starts. */
static inline const void *element(const void *base, int64_t i, const int bf16) {
    return (const char *)base + i * (bf16 ? 2 : 4);
}


/* A float32 rounded to bfloat16 to nearest even, as c10::BFloat16's conversion rounds (a NaN stays a NaN, of another
   bit pattern). */
static inline uint16_t to_bf16(float value) {
    if (value != value) return 0x7FC0;
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

/* Sixteen, for the 512-bit paths. */
AVX512_INLINE __m512 load16(const void *base, int64_t i, const int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)base + i);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* 32 elements from element i of a row as two vectors: bfloat16 in the unpacked order (vpunpcklwd/vpunpckhwd against
   zeros, one instruction per 16 floats: each 128-bit lane's low four elements, then its high four), float32 as
   stored. */
AVX512_INLINE void load32(const void *row, int64_t i, __m512 *first, __m512 *second, const int bf16) {
    if (bf16) {
        const __m512i packed = _mm512_loadu_si512((const uint16_t *)row + i);
        *first = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), packed));
        *second = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), packed));
    } else {
        *first = _mm512_loadu_ps((const float *)row + i);
        *second = _mm512_loadu_ps((const float *)row + i + 16);
    }
}

/* load32's order for bfloat16: lane k of its vector `part` (0 or 1) holds stored element UNPACKED(k) + 4 * part, and
   stored element k lands at position STORED(k) of the 32. */
#define UNPACKED(k) ((k) / 4 * 8 + (k) % 4)
#define STORED(k) ((k) % 8 < 4 ? (k) / 8 * 4 + (k) % 8 : 16 + (k) / 8 * 4 + (k) % 8 - 4)

/* ---------------------------------------------------------------------------------------------------------------
 * exp(x) for x <= 0 in float32: Cephes' expf (range reduction by ln 2, degree-5 polynomial), within 2 ulp. One body
 * for both widths: W is 256 or 512, ROUND the width's rounding intrinsic.
 * ------------------------------------------------------------------------------------------------------------- */
#define EXP_BODY(W, ROUND, x)                                                                                         \
    x = _mm##W##_max_ps(_mm##W##_set1_ps(-87.3f), x) /* a NaN stays NaN */;                                          \
    __m##W fx = ROUND(_mm##W##_mul_ps(x, _mm##W##_set1_ps(1.44269504088896341f)),                                  \
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                                                 \
    x = _mm##W##_fnmadd_ps(fx, _mm##W##_set1_ps(0.693359375f), x);                                                    \
    x = _mm##W##_fnmadd_ps(fx, _mm##W##_set1_ps(-2.12194440e-4f), x);                                                 \
    __m##W y = _mm##W##_set1_ps(1.9875691500e-4f);                                                                    \
    y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(1.3981999507e-3f));                                                  \
    y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(8.3334519073e-3f));                                                  \
    y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(4.1665795894e-2f));                                                  \
    y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(1.6666665459e-1f));                                                  \
    y = _mm##W##_fmadd_ps(y, x, _mm##W##_set1_ps(5.0000001201e-1f));                                                  \
    y = _mm##W##_fmadd_ps(y, _mm##W##_mul_ps(x, x), _mm##W##_add_ps(x, _mm##W##_set1_ps(1.0f)));                      \
    const __m##W##i pow2 =                                                                                            \
        _mm##W##_slli_epi32(_mm##W##_add_epi32(_mm##W##_cvtps_epi32(fx), _mm##W##_set1_epi32(127)), 23);            \
    return _mm##W##_mul_ps(y, _mm##W##_castsi##W##_ps(pow2))

AVX2 static inline __m256 exp8(__m256 x) { EXP_BODY(256, _mm256_round_ps, x); }

AVX512_INLINE __m512 exp16(__m512 x) { EXP_BODY(512, _mm512_roundscale_ps, x); }

/* The kernels, for the Python entries below and the decoder stack (decoder.c); shapes as their entries say. */
/* linear.c: y = x @ w.T, or y += x @ w.T with `accumulate`, on `threads` threads. */
void linear_run(const float *x, const void *w, float *y, int64_t rows, int64_t n, int64_t k, int bf16, int accumulate,
                int threads);
/* elementwise.c, each on the calling thread. */
int slots_in_pool(const int64_t *slots, int64_t rows, int64_t num_slots);
void store_rows(void *pool, const float *src, int64_t src_stride, const int64_t *slots, int64_t rows,
                int64_t width, int bf16);
void rms_norm(const float *x, const void *w, float *y, int64_t rows, int64_t n, float eps, int bf16);
void rotate_rows(float *x, const float *cos, const float *sin, int64_t rows, int64_t stride, int64_t heads,
                 int64_t head_dim);
void silu_mul_rows(const float *gate_up, float *out, int64_t rows, int64_t n);

PyObject *py_linear(PyObject *self, PyObject *args);           /* linear.c */
PyObject *py_decode_attention(PyObject *self, PyObject *args); /* attention.c */
PyObject *py_store_rows(PyObject *self, PyObject *args);       /* elementwise.c */
PyObject *py_rms_norm(PyObject *self, PyObject *args);
PyObject *py_rotate(PyObject *self, PyObject *args);
PyObject *py_silu_mul(PyObject *self, PyObject *args);
PyObject *py_decode_layers(PyObject *self, PyObject *args);    /* decoder.c */
/* attention_amx.c: a prefill chunk's attention on AMX, where amx_usable() says it runs, for a head_dim that is a
   multiple of CHUNK_HEAD_DIM_STEP (one tile row of bf16) up to CHUNK_MAX_HEAD_DIM (four query tiles; module.c exports
   both to Python). */
#define CHUNK_HEAD_DIM_STEP 32
#define CHUNK_MAX_HEAD_DIM 128
int amx_usable(void);
PyObject *py_chunk_workspace(PyObject *self, PyObject *args);
PyObject *py_chunk_attention(PyObject *self, PyObject *args);
/* invariant.c: the batch-invariant matmul over packed weight panels and attention. */
#define INVARIANT_PANEL 32
#define INVARIANT_QUERY_BLOCK 4
PyObject *py_panel_linear(PyObject *self, PyObject *args);
PyObject *py_invariant_attention(PyObject *self, PyObject *args);

#endif
