/*
 * Decode kernels for x86-64 CPUs with AVX2 and FMA: the small-batch matmul (x @ W^T for a few rows of x) and decode
 * attention over the paged KV pool, both bound by memory reads. Weights and the pool are read in float32 or in
 * bfloat16 (half the bytes); activations and all arithmetic are float32.
 *
 * Work is split across torch's own OpenMP thread pool: the libgomp that torch loaded is found by the Python side
 * (local_engine.model.cpu_kernels) and bound here with dlopen(RTLD_NOLOAD), and GOMP_parallel, the entry point
 * `#pragma omp parallel` compiles to (GCC's libgomp ABI, also exported by Intel's libiomp5), is called directly.
 * A second OpenMP runtime would give the process a second pool of spinning threads on the same cores.
 *
 * Every entry point takes raw addresses of contiguous tensors the caller keeps alive (activations float32, weights
 * and pool float32 or bfloat16 as its `bf16` flag says, tables int64), and releases the GIL while it runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

static void run_parallel(void (*fn)(void *, int, int), void *data, int threads) {
    if (threads <= 1 || gomp_parallel == NULL) {
        fn(data, 0, 1);
        return;
    }
    parallel_call call = {fn, data};
    gomp_parallel(parallel_trampoline, &call, (unsigned)threads, 0);
}

#define AVX2 __attribute__((target("avx2,fma")))
/* Specialised at each call for a constant `bf16`: one copy of a kernel per storage dtype. */
#define AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline

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

/* ---------------------------------------------------------------------------------------------------------------
 * y[m, n] = sum_k x[m, k] * w[n, k]: x [M, K], w [N, K], y [M, N], all row-major; w float32 or bfloat16.
 * The weight's rows are read one after another, so each thread streams one linear range of memory (4-row tiles
 * read as 4 streams gave 24 GB/s where this gives 29 on a 2-core EPYC whose torch sum reads 33). Each weight row
 * meets up to 4 input rows at a time, 2 accumulators each; a row of more than 4 inputs is read again from L1.
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct {
    const float *x;
    const void *w;
    float *y;
    int64_t rows, n, k;
    int bf16; /* w in bfloat16 */
} linear_args;

AVX2_INLINE void linear_one_row(const linear_args *a, int64_t n0, int64_t n1, const int bf16) {
    const int64_t k = a->k, k32 = k & ~(int64_t)31, k8 = k & ~(int64_t)7;
    const float *x = a->x;
    for (int64_t n = n0; n < n1; n++) {
        const void *w = element(a->w, n * k, bf16);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
               acc3 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i < k32; i += 32) {
            acc0 = _mm256_fmadd_ps(load8(w, i, bf16), _mm256_loadu_ps(x + i), acc0);
            acc1 = _mm256_fmadd_ps(load8(w, i + 8, bf16), _mm256_loadu_ps(x + i + 8), acc1);
            acc2 = _mm256_fmadd_ps(load8(w, i + 16, bf16), _mm256_loadu_ps(x + i + 16), acc2);
            acc3 = _mm256_fmadd_ps(load8(w, i + 24, bf16), _mm256_loadu_ps(x + i + 24), acc3);
        }
        for (; i < k8; i += 8) acc0 = _mm256_fmadd_ps(load8(w, i, bf16), _mm256_loadu_ps(x + i), acc0);
        float sum = sum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
        for (; i < k; i++) sum += x[i] * load1(w, i, bf16);
        a->y[n] = sum;
    }
}

AVX2_INLINE void linear_rows(const linear_args *a, int64_t n0, int64_t n1, const int bf16) {
    const int64_t k = a->k, k16 = k & ~(int64_t)15;
    for (int64_t n = n0; n < n1; n++) {
        const void *w = element(a->w, n * k, bf16);
        for (int64_t m0 = 0; m0 < a->rows; m0 += 4) {
            const int64_t count = a->rows - m0 < 4 ? a->rows - m0 : 4;
            const float *x[4];
            for (int m = 0; m < 4; m++) x[m] = a->x + (m0 + (m < count ? m : 0)) * k; /* missing rows: repeats */
            __m256 acc[4][2];
            for (int m = 0; m < 4; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
            int64_t i = 0;
            for (; i < k16; i += 16) {
                const __m256 w0 = load8(w, i, bf16), w1 = load8(w, i + 8, bf16);
                for (int m = 0; m < 4; m++) {
                    acc[m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[m] + i), acc[m][0]);
                    acc[m][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[m] + i + 8), acc[m][1]);
                }
            }
            for (int m = 0; m < count; m++) {
                float sum = sum8(_mm256_add_ps(acc[m][0], acc[m][1]));
                for (int64_t j = i; j < k; j++) sum += x[m][j] * load1(w, j, bf16);
                a->y[(m0 + m) * a->n + n] = sum;
            }
        }
    }
}

AVX2 static void linear_part(void *data, int thread, int threads) {
    const linear_args *a = (const linear_args *)data;
    /* One contiguous range of the weight's rows per thread. */
    const int64_t n0 = a->n * thread / threads, n1 = a->n * (thread + 1) / threads;
    if (a->rows == 1) {
        if (a->bf16) linear_one_row(a, n0, n1, 1);
        else linear_one_row(a, n0, n1, 0);
    } else if (a->bf16) {
        linear_rows(a, n0, n1, 1);
    } else {
        linear_rows(a, n0, n1, 0);
    }
}

static PyObject *linear(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t x, w, y, rows, n, k;
    int bf16, threads;
    if (!PyArg_ParseTuple(args, "nnnnnnpi", &x, &w, &y, &rows, &n, &k, &bf16, &threads)) return NULL;
    linear_args a = {(const float *)x, (const void *)w, (float *)y, rows, n, k, bf16};
    Py_BEGIN_ALLOW_THREADS
    run_parallel(linear_part, &a, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------------------------
 * exp(x) for x <= 0 in float32: Cephes' expf (range reduction by ln 2, degree-5 polynomial), within 2 ulp.
 * ------------------------------------------------------------------------------------------------------------- */
AVX2 static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x) /* a NaN stays NaN */;
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2));
}

/* ---------------------------------------------------------------------------------------------------------------
 * Decode attention over the paged pool, one query token per row. q [rows, heads, head_dim]; pool_k, pool_v
 * [num_slots, kv_heads, head_dim] (float32 or bfloat16); slots [rows, stride] (int64); out [rows, heads, head_dim].
 *
 * The work is a list of segments: segment s reads positions [t0, t1) of the slot table of row `table_row` and is
 * attended by the queries of `count` rows (seg_rows[first .. first + count)). A row alone has its context cut into
 * a few segments (flash-decoding: Dao et al., "Flash-Decoding for long-context inference", 2023); rows that share a
 * prefix of slots read it once, in segments every one of them attends, and each reads its own suffix alone (cascade
 * attention: Ye et al., "Cascade Inference", FlashInfer, 2024). Each segment leaves, per row and head, its
 * unnormalised output, maximum score and sum of exponentials, and the parts of a row are merged by those.
 * Threads take segments in order (the caller puts the largest first) from a shared counter.
 * ------------------------------------------------------------------------------------------------------------- */
#define MAX_HEAD_DIM 256
#define MAX_QUERIES 256 /* queries attended together in a segment: of one KV head, rows x (heads / kv_heads) */
#define BLOCK 64

/* scale * (query . key[u]) for 8 keys, as one vector: 8 accumulators, then a tree of horizontal adds. */
AVX2_INLINE __m256 dot8(const float *query, const void *const *key, int64_t d, float scale, const int bf16) {
    __m256 acc[8];
    for (int u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
        const __m256 q = _mm256_loadu_ps(query + i);
        for (int u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(load8(key[u], i, bf16), q, acc[u]);
    }
    const __m256 low = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    const __m256 high = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
    const __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
    return _mm256_mul_ps(sums, _mm256_set1_ps(scale));
}

enum { TABLE_ROW, FIRST_POSITION, END_POSITION, FIRST_ROW, ROW_COUNT, SEGMENT_FIELDS };

typedef struct {
    const float *q; /* a row's heads head_dim floats apart, rows q_stride floats apart */
    const void *k, *v; /* float32 or, with bf16, bfloat16 */
    const int64_t *slots, *segments, *seg_rows, *partial_offset;
    float *partial; /* per segment: [count, heads, head_dim + 2] (output, maximum, sum) */
    int64_t q_stride, stride, num_segments, heads, kv_heads, head_dim;
    float scale;
    int bf16;
    int64_t next; /* the next segment to take */
} attention_args;

AVX2_INLINE void attend_segment(const attention_args *a, int64_t segment, const int bf16) {
    const int64_t *seg = a->segments + segment * SEGMENT_FIELDS;
    const int64_t d = a->head_dim, group = a->heads / a->kv_heads, record = d + 2;
    const int64_t count = seg[ROW_COUNT], t0 = seg[FIRST_POSITION], t1 = seg[END_POSITION];
    const int64_t *slots = a->slots + seg[TABLE_ROW] * a->stride;
    const int64_t *rows = a->seg_rows + seg[FIRST_ROW];
    float *partial = a->partial + a->partial_offset[segment];
    float scores[MAX_QUERIES][BLOCK] __attribute__((aligned(32)));
    const float *query[MAX_QUERIES];
    float *acc[MAX_QUERIES];
    /* Up to MAX_QUERIES queries at a time: one KV head's queries of all the segment's rows, or a part of them. */
    for (int64_t h = 0; h < a->kv_heads; h++)
    for (int64_t j0 = 0; j0 < count * group; j0 += MAX_QUERIES) {
        const int64_t queries = count * group - j0 < MAX_QUERIES ? count * group - j0 : MAX_QUERIES;
        for (int64_t j = 0; j < queries; j++) {
            const int64_t row = rows[(j0 + j) / group], head = h * group + (j0 + j) % group;
            query[j] = a->q + row * a->q_stride + head * d;
            acc[j] = partial + (((j0 + j) / group) * a->heads + head) * record;
            memset(acc[j], 0, sizeof(float) * d);
            acc[j][d] = -INFINITY;
            acc[j][d + 1] = 0.0f;
        }
        for (int64_t b0 = t0; b0 < t1; b0 += BLOCK) {
            const int64_t n = t1 - b0 < BLOCK ? t1 - b0 : BLOCK;
            const void *key[BLOCK], *value[BLOCK];
            for (int64_t t = 0; t < n; t++) {
                key[t] = element(a->k, (slots[b0 + t] * a->kv_heads + h) * d, bf16);
                value[t] = element(a->v, (slots[b0 + t] * a->kv_heads + h) * d, bf16);
            }
            for (int64_t j = 0; j < queries; j++) {
                int64_t t = 0;
                for (; t + 8 <= n; t += 8) _mm256_store_ps(scores[j] + t, dot8(query[j], key + t, d, a->scale, bf16));
                for (; t < n; t++) {
                    __m256 dot = _mm256_setzero_ps();
                    for (int64_t i = 0; i < d; i += 8)
                        dot = _mm256_fmadd_ps(load8(key[t], i, bf16), _mm256_loadu_ps(query[j] + i), dot);
                    scores[j][t] = sum8(dot) * a->scale;
                }
            }
            for (int64_t j = 0; j < queries; j++) {
                float *out = acc[j];
                float block_max = -INFINITY;
                for (int64_t t = 0; t < n; t++) block_max = scores[j][t] > block_max ? scores[j][t] : block_max;
                const float new_max = block_max > out[d] ? block_max : out[d];
                const float rescale = expf(out[d] - new_max); /* 0 for the first block: out[d] is -inf */
                int64_t t = 0;
                __m256 sum = _mm256_setzero_ps();
                for (; t + 8 <= n; t += 8) {
                    const __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(scores[j] + t), _mm256_set1_ps(new_max)));
                    _mm256_store_ps(scores[j] + t, p);
                    sum = _mm256_add_ps(sum, p);
                }
                float total = sum8(sum);
                for (; t < n; t++) {
                    scores[j][t] = expf(scores[j][t] - new_max);
                    total += scores[j][t];
                }
                out[d] = new_max;
                out[d + 1] = out[d + 1] * rescale + total;
                /* The block's values come from memory for the first query, from L1 for the others; 64 of a query's
                   dimensions stay in 8 registers across the block. */
                for (int64_t i0 = 0; i0 < d; i0 += 64) {
                    const int64_t width = d - i0 < 64 ? (d - i0) / 8 : 8;
                    __m256 reg[8];
                    const __m256 r = _mm256_set1_ps(rescale);
                    for (int k = 0; k < width; k++) reg[k] = _mm256_mul_ps(_mm256_loadu_ps(out + i0 + 8 * k), r);
                    for (int64_t u = 0; u < n; u++) {
                        const __m256 p = _mm256_set1_ps(scores[j][u]);
                        for (int k = 0; k < width; k++)
                            reg[k] = _mm256_fmadd_ps(p, load8(value[u], i0 + 8 * k, bf16), reg[k]);
                    }
                    for (int k = 0; k < width; k++) _mm256_storeu_ps(out + i0 + 8 * k, reg[k]);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * The same segments with 512-bit vectors, for a KV head read by many queries (rows sharing a prefix, or a wide GQA
 * group) on a CPU with AVX-512F (every CPU with native bf16 has it): the head's queries are transposed once per
 * segment, with the scale folded in, so that each key element, broadcast, meets 16 queries per FMA. Scores come out
 * as [key][query] vectors with no horizontal sums, the online softmax runs across 16 queries per instruction, and
 * values are accumulated for 4 queries at a time, each value vector loaded once for them.
 * ------------------------------------------------------------------------------------------------------------- */
#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#define AVX512_INLINE __attribute__((target("avx512f,avx2,fma"), always_inline)) static inline
#define GROUP_QUERIES 32 /* a KV head's queries attended together: two vectors */
#define MIN_GROUP_QUERIES 8 /* fewer take the AVX2 path, whose vectors run along head_dim */

static int avx512_enabled = 0;

AVX512_INLINE __m512 load16(const void *base, int64_t i, const int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)base + i);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* exp8's polynomial on 16 lanes. */
AVX512_INLINE __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.3f), x);
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    const __m512i pow2 = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(pow2));
}

AVX512_INLINE void attend_group(const attention_args *a, int64_t segment, const int bf16) {
    const int64_t *seg = a->segments + segment * SEGMENT_FIELDS;
    const int64_t d = a->head_dim, group = a->heads / a->kv_heads, record = d + 2;
    const int64_t count = seg[ROW_COUNT], t0 = seg[FIRST_POSITION], t1 = seg[END_POSITION];
    const int64_t *slots = a->slots + seg[TABLE_ROW] * a->stride;
    const int64_t *rows = a->seg_rows + seg[FIRST_ROW];
    float *partial = a->partial + a->partial_offset[segment];
    float queries_t[MAX_HEAD_DIM][GROUP_QUERIES] __attribute__((aligned(64))); /* [dimension][query], scaled */
    float scores[BLOCK][GROUP_QUERIES] __attribute__((aligned(64)));            /* [key][query] */
    float widened[BLOCK * MAX_HEAD_DIM] __attribute__((aligned(64)));           /* a bf16 block's values */
    float keys[4][MAX_HEAD_DIM] __attribute__((aligned(64)));                   /* 4 bf16 keys, widened */
    float row_max[GROUP_QUERIES] __attribute__((aligned(64))), row_sum[GROUP_QUERIES] __attribute__((aligned(64)));
    float rescale[GROUP_QUERIES] __attribute__((aligned(64))), spare[4][MAX_HEAD_DIM] __attribute__((aligned(64)));
    float *out[GROUP_QUERIES];
    for (int64_t h = 0; h < a->kv_heads; h++)
    for (int64_t j0 = 0; j0 < count * group; j0 += GROUP_QUERIES) {
        const int64_t queries = count * group - j0 < GROUP_QUERIES ? count * group - j0 : GROUP_QUERIES;
        const int vectors = queries > 16 ? 2 : 1;
        for (int64_t j = 0; j < GROUP_QUERIES; j++) {
            const float *q = NULL;
            if (j < queries) {
                const int64_t row = rows[(j0 + j) / group], head = h * group + (j0 + j) % group;
                q = a->q + row * a->q_stride + head * d;
                out[j] = partial + (((j0 + j) / group) * a->heads + head) * record;
                memset(out[j], 0, sizeof(float) * d);
            } else {
                out[j] = spare[j % 4]; /* a missing query of a tile of 4: its zero scores go nowhere */
                memset(out[j], 0, sizeof(float) * d);
            }
            for (int64_t i = 0; i < d; i++) queries_t[i][j] = q != NULL ? q[i] * a->scale : 0.0f;
            row_max[j] = -INFINITY;
            row_sum[j] = 0.0f;
        }
        for (int64_t b0 = t0; b0 < t1; b0 += BLOCK) {
            const int64_t n = t1 - b0 < BLOCK ? t1 - b0 : BLOCK;
            const void *key[BLOCK + 3];
            const float *value[BLOCK];
            for (int64_t t = 0; t < n; t++) {
                key[t] = element(a->k, (slots[b0 + t] * a->kv_heads + h) * d, bf16);
                const void *stored = element(a->v, (slots[b0 + t] * a->kv_heads + h) * d, bf16);
                if (bf16) {
                    for (int64_t i = 0; i < d; i += 16) _mm512_store_ps(widened + t * d + i, load16(stored, i, 1));
                    value[t] = widened + t * d;
                } else {
                    value[t] = (const float *)stored;
                }
            }
            for (int64_t t = n; t < n + 3; t++) key[t] = key[n - 1]; /* the last tile of 4 keys repeats one */
            /* Scores, 4 keys at a time: 8 independent sums of 16 queries. */
            for (int64_t t = 0; t < n; t += 4) {
                const float *k[4];
                for (int u = 0; u < 4; u++) {
                    if (bf16) {
                        for (int64_t i = 0; i < d; i += 16) _mm512_store_ps(keys[u] + i, load16(key[t + u], i, 1));
                        k[u] = keys[u];
                    } else {
                        k[u] = (const float *)key[t + u];
                    }
                }
                __m512 sum[4][2];
                for (int u = 0; u < 4; u++) sum[u][0] = sum[u][1] = _mm512_setzero_ps();
                for (int64_t i = 0; i < d; i++) {
                    const __m512 q0 = _mm512_load_ps(queries_t[i]);
                    const __m512 q1 = _mm512_load_ps(queries_t[i] + 16);
                    for (int u = 0; u < 4; u++) {
                        const __m512 broadcast = _mm512_set1_ps(k[u][i]);
                        sum[u][0] = _mm512_fmadd_ps(broadcast, q0, sum[u][0]);
                        if (vectors > 1) sum[u][1] = _mm512_fmadd_ps(broadcast, q1, sum[u][1]);
                    }
                }
                for (int u = 0; u < 4 && t + u < n; u++) {
                    _mm512_store_ps(scores[t + u], sum[u][0]);
                    _mm512_store_ps(scores[t + u] + 16, sum[u][1]);
                }
            }
            /* The online softmax across the queries. */
            for (int v = 0; v < vectors; v++) {
                __m512 top = _mm512_set1_ps(-INFINITY);
                for (int64_t t = 0; t < n; t++) top = _mm512_max_ps(top, _mm512_load_ps(scores[t] + 16 * v));
                const __m512 old_max = _mm512_load_ps(row_max + 16 * v);
                const __m512 new_max = _mm512_max_ps(old_max, top);
                __m512 total = _mm512_setzero_ps();
                for (int64_t t = 0; t < n; t++) {
                    const __m512 p = exp16(_mm512_sub_ps(_mm512_load_ps(scores[t] + 16 * v), new_max));
                    _mm512_store_ps(scores[t] + 16 * v, p);
                    total = _mm512_add_ps(total, p);
                }
                /* tiny for the first block (old_max is -inf), where it scales zeros */
                const __m512 factor = exp16(_mm512_sub_ps(old_max, new_max));
                _mm512_store_ps(rescale + 16 * v, factor);
                _mm512_store_ps(row_sum + 16 * v,
                                _mm512_fmadd_ps(_mm512_load_ps(row_sum + 16 * v), factor, total));
                _mm512_store_ps(row_max + 16 * v, new_max);
            }
            /* Values, 4 queries x 64 dimensions in 16 registers. */
            for (int64_t j = 0; j < queries; j += 4)
            for (int64_t i0 = 0; i0 < d; i0 += 64) {
                const int width = d - i0 < 64 ? (int)((d - i0) / 16) : 4;
                __m512 x[4][4];
                for (int q = 0; q < 4; q++)
                    for (int w = 0; w < width; w++)
                        x[q][w] = _mm512_mul_ps(_mm512_loadu_ps(out[j + q] + i0 + 16 * w),
                                                _mm512_set1_ps(rescale[j + q]));
                for (int64_t u = 0; u < n; u++) {
                    __m512 p[4];
                    for (int q = 0; q < 4; q++) p[q] = _mm512_set1_ps(scores[u][j + q]);
                    for (int w = 0; w < width; w++) {
                        const __m512 val = _mm512_loadu_ps(value[u] + i0 + 16 * w);
                        for (int q = 0; q < 4; q++) x[q][w] = _mm512_fmadd_ps(p[q], val, x[q][w]);
                    }
                }
                for (int q = 0; q < 4; q++)
                    for (int w = 0; w < width; w++) _mm512_storeu_ps(out[j + q] + i0 + 16 * w, x[q][w]);
            }
        }
        for (int64_t j = 0; j < queries; j++) out[j][d] = row_max[j], out[j][d + 1] = row_sum[j];
    }
}

AVX512 static void attend_group_avx512(const attention_args *a, int64_t segment) {
    if (a->bf16) attend_group(a, segment, 1);
    else attend_group(a, segment, 0);
}

AVX2 static void attention_part(void *data, int thread, int threads) {
    (void)thread, (void)threads;
    attention_args *a = (attention_args *)data;
    for (;;) {
        const int64_t segment = __atomic_fetch_add(&a->next, 1, __ATOMIC_RELAXED);
        if (segment >= a->num_segments) return;
        const int64_t queries = a->segments[segment * SEGMENT_FIELDS + ROW_COUNT] * (a->heads / a->kv_heads);
        if (avx512_enabled && a->head_dim % 16 == 0 && queries >= MIN_GROUP_QUERIES) {
            attend_group_avx512(a, segment);
        } else if (a->bf16) {
            attend_segment(a, segment, 1);
        } else {
            attend_segment(a, segment, 0);
        }
    }
}

/* out[row, head] = sum over the row's parts of exp(max_part - max) * output_part / the same sum of sum_part. */
static void merge_segments(const attention_args *a, float *out, float *row_max, float *row_sum, int64_t rows) {
    const int64_t d = a->head_dim, record = d + 2;
    memset(out, 0, sizeof(float) * (size_t)(rows * a->heads * d));
    for (int64_t i = 0; i < rows * a->heads; i++) row_max[i] = -INFINITY, row_sum[i] = 0.0f;
    for (int64_t s = 0; s < a->num_segments; s++) {
        const int64_t *seg = a->segments + s * SEGMENT_FIELDS;
        const float *partial = a->partial + a->partial_offset[s];
        for (int64_t j = 0; j < seg[ROW_COUNT]; j++)
            for (int64_t head = 0; head < a->heads; head++) {
                const float *part = partial + (j * a->heads + head) * record;
                if (part[d] == -INFINITY) continue; /* an empty segment */
                const int64_t at = a->seg_rows[seg[FIRST_ROW] + j] * a->heads + head;
                float *o = out + at * d;
                const float top = part[d] > row_max[at] ? part[d] : row_max[at];
                const float keep = expf(row_max[at] - top), add = expf(part[d] - top);
                for (int64_t i = 0; i < d; i++) o[i] = o[i] * keep + part[i] * add;
                row_sum[at] = row_sum[at] * keep + part[d + 1] * add;
                row_max[at] = top;
            }
    }
    for (int64_t i = 0; i < rows * a->heads; i++) {
        const float inverse = 1.0f / row_sum[i];
        for (int64_t k = 0; k < d; k++) out[i * d + k] *= inverse;
    }
}

static PyObject *decode_attention(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t q, q_stride, k, v, slots, segments, seg_rows, out, rows, stride, num_segments, heads, kv_heads, head_dim;
    float scale;
    int bf16, threads;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnnnnnnfpi", &q, &q_stride, &k, &v, &slots, &segments, &seg_rows, &out, &rows,
                          &stride, &num_segments, &heads, &kv_heads, &head_dim, &scale, &bf16, &threads))
        return NULL;
    if (head_dim % 8 || head_dim > MAX_HEAD_DIM || kv_heads <= 0 || heads % kv_heads) {
        PyErr_SetString(PyExc_ValueError, "unsupported attention shape");
        return NULL;
    }
    const int64_t *seg = (const int64_t *)segments, record = head_dim + 2;
    int64_t *offset = malloc(sizeof(int64_t) * (size_t)(num_segments + 1));
    if (offset == NULL) return PyErr_NoMemory();
    offset[0] = 0;
    for (Py_ssize_t s = 0; s < num_segments; s++)
        offset[s + 1] = offset[s] + seg[s * SEGMENT_FIELDS + ROW_COUNT] * heads * record;
    float *partial = malloc(sizeof(float) * (size_t)(offset[num_segments] + 2 * rows * heads));
    if (partial == NULL) {
        free(offset);
        return PyErr_NoMemory();
    }
    attention_args a = {(const float *)q, (const void *)k, (const void *)v, (const int64_t *)slots, seg,
                        (const int64_t *)seg_rows, offset, partial, q_stride, stride, num_segments, heads, kv_heads,
                        head_dim, scale, bf16, 0};
    float *row_max = partial + offset[num_segments], *row_sum = row_max + rows * heads;
    Py_BEGIN_ALLOW_THREADS
    run_parallel(attention_part, &a, threads < num_segments ? threads : (int)num_segments);
    merge_segments(&a, (float *)out, row_max, row_sum, rows);
    Py_END_ALLOW_THREADS
    free(partial);
    free(offset);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------------------------
 * A step's new K (or V) into the pool: row r of src (`width` floats, rows `src_stride` floats apart) into slot
 * slots[r] (each checked against num_slots) of a pool of `width`-element slots, float32 or bfloat16. bfloat16 is
 * rounded to nearest even as c10::BFloat16's conversion rounds, so the pool holds what torch's `.to(torch.bfloat16)`
 * would write (a NaN stays a NaN, of another bit pattern).
 * ------------------------------------------------------------------------------------------------------------- */
static inline uint16_t to_bf16(float value) {
    if (value != value) return 0x7FC0;
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

static PyObject *store_rows(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t pool, num_slots, src, src_stride, slots, rows, width;
    int bf16;
    if (!PyArg_ParseTuple(args, "nnnnnnnp", &pool, &num_slots, &src, &src_stride, &slots, &rows, &width, &bf16))
        return NULL;
    for (Py_ssize_t r = 0; r < rows; r++)
        if (((const int64_t *)slots)[r] < 0 || ((const int64_t *)slots)[r] >= num_slots) {
            PyErr_SetString(PyExc_IndexError, "slot out of the pool");
            return NULL;
        }
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *from = (const float *)src + r * src_stride;
        const int64_t slot = ((const int64_t *)slots)[r];
        if (bf16) {
            uint16_t *to = (uint16_t *)pool + slot * width;
            for (Py_ssize_t i = 0; i < width; i++) to[i] = to_bf16(from[i]);
        } else {
            memcpy((float *)pool + slot * width, from, sizeof(float) * (size_t)width);
        }
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------------------------
 * The elementwise steps of a Llama decoder layer, each one pass over a step's few rows on the calling thread
 * (torch spends more on dispatching them than on the arithmetic): RMSNorm (Zhang and Sennrich, 2019, as
 * transformers' LlamaRMSNorm computes it: x * rsqrt(mean(x^2) + eps), then times the weight), the rotary embedding
 * (Su et al., "RoFormer", 2021, in the rotate_half form: x * cos + rotate_half(x) * sin) and SwiGLU's
 * silu(gate) * up (Shazeer, "GLU Variants Improve Transformer", 2020).
 * ------------------------------------------------------------------------------------------------------------- */
AVX2_INLINE void rms_norm_rows(const float *x, const void *w, float *y, int64_t rows, int64_t n, float eps,
                               const int bf16) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t r = 0; r < rows; r++) {
        const float *in = x + r * n;
        float *out = y + r * n;
        __m256 squares = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i < n8; i += 8) {
            const __m256 v = _mm256_loadu_ps(in + i);
            squares = _mm256_fmadd_ps(v, v, squares);
        }
        float total = sum8(squares);
        for (; i < n; i++) total += in[i] * in[i];
        const float inverse = 1.0f / sqrtf(total / (float)n + eps);
        const __m256 scale = _mm256_set1_ps(inverse);
        for (i = 0; i < n8; i += 8)
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(in + i), scale),
                                                    load8(w, i, bf16)));
        for (; i < n; i++) out[i] = in[i] * inverse * load1(w, i, bf16);
    }
}

AVX2 static PyObject *rms_norm(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t x, w, y, rows, n;
    float eps;
    int bf16;
    if (!PyArg_ParseTuple(args, "nnnnnfp", &x, &w, &y, &rows, &n, &eps, &bf16)) return NULL;
    if (bf16) rms_norm_rows((const float *)x, (const void *)w, (float *)y, rows, n, eps, 1);
    else rms_norm_rows((const float *)x, (const void *)w, (float *)y, rows, n, eps, 0);
    Py_RETURN_NONE;
}

/* In place on heads [0, heads) of each row of x (rows `stride` floats apart, heads head_dim apart); cos and sin
   [rows, head_dim]. */
AVX2 static void rotate_rows(float *x, const float *cos, const float *sin, int64_t rows, int64_t stride,
                             int64_t heads, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + r * head_dim, *s = sin + r * head_dim;
        for (int64_t h = 0; h < heads; h++) {
            float *first = x + r * stride + h * head_dim, *second = first + half;
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {
                const __m256 a = _mm256_loadu_ps(first + i), b = _mm256_loadu_ps(second + i);
                _mm256_storeu_ps(first + i, _mm256_fnmadd_ps(b, _mm256_loadu_ps(s + i),
                                                             _mm256_mul_ps(a, _mm256_loadu_ps(c + i))));
                _mm256_storeu_ps(second + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(s + half + i),
                                                             _mm256_mul_ps(b, _mm256_loadu_ps(c + half + i))));
            }
            for (; i < half; i++) {
                const float a = first[i], b = second[i];
                first[i] = a * c[i] - b * s[i];
                second[i] = b * c[half + i] + a * s[half + i];
            }
        }
    }
}

static PyObject *rotate(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t x, cos, sin, rows, stride, heads, head_dim;
    if (!PyArg_ParseTuple(args, "nnnnnnn", &x, &cos, &sin, &rows, &stride, &heads, &head_dim)) return NULL;
    rotate_rows((float *)x, (const float *)cos, (const float *)sin, rows, stride, heads, head_dim);
    Py_RETURN_NONE;
}

/* out [rows, n] = silu(gate_up[:, :n]) * gate_up[:, n:], gate_up [rows, 2n]. */
AVX2 static void silu_mul_rows(const float *gate_up, float *out, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * n, *up = gate + n;
        float *o = out + r * n;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256 g = _mm256_loadu_ps(gate + i);
            const __m256 e = exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(88.0f)));
            const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
        }
        for (; i < n; i++) o[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

static PyObject *silu_mul(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t gate_up, out, rows, n;
    if (!PyArg_ParseTuple(args, "nnnn", &gate_up, &out, &rows, &n)) return NULL;
    silu_mul_rows((const float *)gate_up, (float *)out, rows, n);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------------------------- */

static PyObject *supported(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    __builtin_cpu_init();
    avx512_enabled = __builtin_cpu_supports("avx512f");
    return PyBool_FromLong(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
}

static PyObject *use_avx512(PyObject *self, PyObject *args) {
    (void)self;
    int enabled;
    if (!PyArg_ParseTuple(args, "p", &enabled)) return NULL;
    __builtin_cpu_init();
    avx512_enabled = enabled && __builtin_cpu_supports("avx512f");
    return PyBool_FromLong(avx512_enabled);
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
    {"bind_openmp", bind_openmp, METH_VARARGS, "bind_openmp(path) -> bool: use the loaded OpenMP runtime at path."},
    {"linear", linear, METH_VARARGS, "linear(x, w, y, rows, n, k, bf16, threads): y = x @ w.T in float32."},
    {"rms_norm", rms_norm, METH_VARARGS, "rms_norm(x, w, y, rows, n, eps, bf16): y = RMSNorm(x) * w."},
    {"rotate", rotate, METH_VARARGS, "rotate(x, cos, sin, rows, stride, heads, head_dim): rotary, in place."},
    {"silu_mul", silu_mul, METH_VARARGS, "silu_mul(gate_up, out, rows, n): out = silu(gate) * up."},
    {"decode_attention", decode_attention, METH_VARARGS,
     "decode_attention(q, q_stride, k, v, slots, segments, seg_rows, out, rows, stride, num_segments, heads, "
     "kv_heads, head_dim, scale, bf16, threads)."},
    {"store_rows", store_rows, METH_VARARGS, "store_rows(pool, num_slots, src, src_stride, slots, rows, width, bf16)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cpu_kernels(void) { return PyModule_Create(&module); }
