/* The matmul of a few input rows against a weight (local_engine.model.cpu_kernels.linear). */
#include "cpu_kernels.h"

/* ---------------------------------------------------------------------------------------------------------------
 * y[m, n] = sum_k x[m, k] * w[n, k]: x [M, K], w [N, K], y [M, N], all row-major; w float32 or bfloat16.
 * The weight's rows are read one after another, so each thread streams one linear range of memory (4-row tiles
 * read as 4 streams gave 24 GB/s where this gives 29 on a 2-core EPYC whose torch sum reads 33). On this 256-bit
 * path each weight row meets up to 4 input rows at a time, 2 accumulators each; a row of more than 4 inputs is read
 * again from L1 (the 512-bit path below takes up to 8).
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct {
    const float *x;
    const void *w;
    float *y;
    int64_t rows, n, k;
    int bf16;       /* w in bfloat16 */
    int accumulate; /* y += x @ w.T (a residual add) instead of y = */
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
        a->y[n] = a->accumulate ? a->y[n] + sum : sum;
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
                float *to = a->y + (m0 + m) * a->n + n;
                *to = a->accumulate ? *to + sum : sum;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * bfloat16 weights on the 512-bit path. A weight line (32 bfloat16, 64 bytes) is widened by load32's two unpacks
 * (instead of a zero-extend and a shift per 8), which leaves its elements in load32's order; the input rows are
 * permuted to that order once per call, so every product pairs the same two elements as above. With fewer
 * instructions per byte a thread keeps more of the weight's lines in flight, and it also asks for the lines
 * PREFETCH_BYTES ahead: on a 2-core Xeon VM a 212 MB weight streamed at 17-20 GB/s on the 256-bit path and at
 * 26-29 GB/s this way, where a torch sum of the same bytes in float32 reads 24-26.
 * ------------------------------------------------------------------------------------------------------------- */
enum { LINE = 32, PREFETCH_BYTES = 4096 };

/* x [rows, k] with each whole line of every row in load32's order (the tail past the last whole line is not read). */
static void unpacked_rows(const float *x, float *to, int64_t rows, int64_t k) {
    for (int64_t m = 0; m < rows; m++)
        for (int64_t line = 0; line + LINE <= k; line += LINE)
            for (int j = 0; j < LINE; j++)
                to[m * k + line + j] = x[m * k + line + UNPACKED(j % 16) + 4 * (j / 16)];
}

/* The sum of row m's products with weight row w past the whole lines, then the store (or residual add). */
static inline void finish_row(const linear_args *a, int64_t m, int64_t n, const uint16_t *w, int64_t from,
                              float sum) {
    for (int64_t j = from; j < a->k; j++) sum += a->x[m * a->k + j] * load1(w, j, 1);
    float *to = a->y + m * a->n + n;
    *to = a->accumulate ? *to + sum : sum;
}

AVX512_INLINE void linear_one_row_wide(const linear_args *a, const float *xp, int64_t n0, int64_t n1) {
    const int64_t k = a->k, whole = k & ~(int64_t)(LINE - 1), pairs = k & ~(int64_t)(2 * LINE - 1);
    for (int64_t n = n0; n < n1; n++) {
        const uint16_t *w = (const uint16_t *)a->w + n * k;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
               acc3 = _mm512_setzero_ps(), lo, hi;
        int64_t i = 0;
        for (; i < pairs; i += 2 * LINE) {
            _mm_prefetch((const char *)(w + i) + PREFETCH_BYTES, _MM_HINT_T0);
            _mm_prefetch((const char *)(w + i + LINE) + PREFETCH_BYTES, _MM_HINT_T0);
            load32(w, i, &lo, &hi, 1);
            acc0 = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xp + i), acc0);
            acc1 = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xp + i + 16), acc1);
            load32(w, i + LINE, &lo, &hi, 1);
            acc2 = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xp + i + LINE), acc2);
            acc3 = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xp + i + LINE + 16), acc3);
        }
        if (i < whole) {
            _mm_prefetch((const char *)(w + i) + PREFETCH_BYTES, _MM_HINT_T0);
            load32(w, i, &lo, &hi, 1);
            acc0 = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xp + i), acc0);
            acc1 = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xp + i + 16), acc1);
        }
        finish_row(a, 0, n, w, whole, _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1),
                                                                          _mm512_add_ps(acc2, acc3))));
    }
}

/* `tile` (4 or 8) input rows per pass over a weight row, each line widened once for all of them. */
AVX512_INLINE void linear_rows_wide(const linear_args *a, const float *xp, int64_t n0, int64_t n1, const int tile) {
    const int64_t k = a->k, whole = k & ~(int64_t)(LINE - 1);
    for (int64_t n = n0; n < n1; n++) {
        const uint16_t *w = (const uint16_t *)a->w + n * k;
        for (int64_t m0 = 0; m0 < a->rows; m0 += tile) {
            const int64_t count = a->rows - m0 < tile ? a->rows - m0 : tile;
            const float *x[8];
            for (int m = 0; m < tile; m++) x[m] = xp + (m0 + (m < count ? m : 0)) * k; /* missing rows: repeats */
            __m512 acc[8][2], lo, hi;
            for (int m = 0; m < tile; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
            for (int64_t i = 0; i < whole; i += LINE) {
                if (m0 == 0) _mm_prefetch((const char *)(w + i) + PREFETCH_BYTES, _MM_HINT_T0);
                load32(w, i, &lo, &hi, 1);
                for (int m = 0; m < tile; m++) {
                    acc[m][0] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x[m] + i), acc[m][0]);
                    acc[m][1] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x[m] + i + 16), acc[m][1]);
                }
            }
            for (int m = 0; m < count; m++)
                finish_row(a, m0 + m, n, w, whole, _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1])));
        }
    }
}

typedef struct {
    const linear_args *a;
    const float *unpacked; /* the input rows in load32's order, for the 512-bit path; NULL: the 256-bit path */
} linear_call;

/* Not inlined into linear_part: code built for AVX-512 may use its registers anywhere, and linear_part runs on CPUs
   with AVX2 alone. */
AVX512 static void linear_wide(const linear_args *a, const float *unpacked, int64_t n0, int64_t n1) {
    if (a->rows == 1) linear_one_row_wide(a, unpacked, n0, n1);
    else if (a->rows <= 4) linear_rows_wide(a, unpacked, n0, n1, 4);
    else linear_rows_wide(a, unpacked, n0, n1, 8);
}

AVX2 static void linear_part(void *data, int thread, int threads) {
    const linear_call *call = (const linear_call *)data;
    const linear_args *a = call->a;
    /* One contiguous range of the weight's rows per thread. */
    const int64_t n0 = a->n * thread / threads, n1 = a->n * (thread + 1) / threads;
    if (call->unpacked != NULL) {
        linear_wide(a, call->unpacked, n0, n1);
    } else if (a->rows == 1) {
        if (a->bf16) linear_one_row(a, n0, n1, 1);
        else linear_one_row(a, n0, n1, 0);
    } else if (a->bf16) {
        linear_rows(a, n0, n1, 1);
    } else {
        linear_rows(a, n0, n1, 0);
    }
}

void linear_run(const float *x, const void *w, float *y, int64_t rows, int64_t n, int64_t k, int bf16, int accumulate,
                int threads) {
    linear_args a = {x, w, y, rows, n, k, bf16, accumulate};
    /* Without room for the permuted rows (or a whole line), the 256-bit path: this cannot fail. */
    float *unpacked = bf16 && avx512_enabled && k >= LINE ? malloc(sizeof(float) * (size_t)(rows * k)) : NULL;
    if (unpacked != NULL) unpacked_rows(x, unpacked, rows, k);
    count_path(unpacked != NULL ? PATH_MATMUL_512 : PATH_MATMUL_256);
    linear_call call = {&a, unpacked};
    run_parallel(linear_part, &call, threads);
    free(unpacked);
}

PyObject *py_linear(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t x, w, y, rows, n, k;
    int bf16, threads;
    if (!PyArg_ParseTuple(args, "nnnnnnpi", &x, &w, &y, &rows, &n, &k, &bf16, &threads)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    linear_run((const float *)x, (const void *)w, (float *)y, rows, n, k, bf16, 0, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
