/* The matmul of a few input rows against a weight (local_engine.model.cpu_kernels.linear). */
#include "cpu_kernels.h"

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

void linear_run(const float *x, const void *w, float *y, int64_t rows, int64_t n, int64_t k, int bf16, int accumulate,
                int threads) {
    linear_args a = {x, w, y, rows, n, k, bf16, accumulate};
    run_parallel(linear_part, &a, threads);
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
