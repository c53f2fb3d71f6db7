/*
 * Batch-invariant matmul and attention (local_engine.model.invariant_kernels).
 *
 * Each output element is computed by one fixed sequence of float32 operations that depends on nothing but that
 * element's inputs: not on how many rows the call holds, where the row sits among them, how many threads run, or
 * how a prompt was split into steps. So a token's stored K/V and its logits are the same bits whether it was
 * computed in a long prefill chunk, alone as a decode row, beside 31 other requests or after its prefix came from
 * the cache, and a greedy answer cannot change with the cache state or the batch (the property SGLang's deterministic
 * inference and vLLM's batch-invariant mode give on GPUs with fixed-order Triton kernels).
 *
 * The fixed orders:
 * - matmul: y[m, n] = (...((x[m, 0] * w[n, 0]) + x[m, 1] * w[n, 1]) + ...) + x[m, k-1] * w[n, k-1], one fused
 *   multiply-add per input feature, in feature order. The weight is packed in panels of PANEL output columns
 *   ([panels][k][PANEL], zero columns past n), so the vector lanes run across output columns and every lane takes the
 *   same sequence; up to ROW_BLOCK rows share each load of 16 of a panel's columns (6 rows x 16 columns: 12
 *   accumulators in 16 AVX2 registers), and a thread walks ROW_TILE rows against each of its panels while the panel
 *   stays in L2.
 * - attention, per query row and head over its context c: s_j = dot(q, k_j) * scale (8-lane partial sums over the
 *   head's dims in order, then sum8), m = max_j s_j, p_j = exp8(s_j - m) (the same polynomial in every lane),
 *   l = the 8-lane sums of p_j in key order, then sum8; out = (sum_j p_j v_j, one fused multiply-add per key in key
 *   order) / l. A row only ever meets the keys of its own context; work is split across threads by blocks of up to
 *   QUERY_BLOCK consecutive rows of one sequence and KV head, which changes no row's sequence.
 */
#include "cpu_kernels.h"

enum { PANEL = INVARIANT_PANEL, ROW_BLOCK = 6, ROW_TILE = 96, QUERY_BLOCK = INVARIANT_QUERY_BLOCK };

/* ---------------------------------------------------------------------------------------------------------------
 * Matmul: x [rows, k] (rows x_stride floats apart) against a weight packed as [panels][k][PANEL] (float32 or
 * bfloat16), into y [rows, n] (rows y_stride floats apart).
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct {
    const float *x;
    const void *panels;
    float *y;
    int64_t rows, n, k, x_stride, y_stride, num_panels;
    int bf16;
} panel_args;

/* `nr` rows (a constant at each call) from `x` against 16 columns of one panel (`half` 0 or 1); `cols` of those 16
   are stored. Six rows share each load of the weight's 16 columns: 12 accumulators, 2 loads and 6 broadcasts per
   feature. */
AVX2_INLINE void panel_block(const panel_args *a, const float *x, const void *panel, int half, float *y, const int nr,
                             int cols, const int bf16) {
    __m256 acc[ROW_BLOCK][2];
    for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const int64_t offset = 16 * half;
    for (int64_t i = 0; i < a->k; i++) {
        const int64_t at = i * PANEL + offset;
        const __m256 w0 = load8(panel, at, bf16), w1 = load8(panel, at + 8, bf16);
        for (int r = 0; r < nr; r++) {
            const __m256 xv = _mm256_broadcast_ss(x + r * a->x_stride + i);
            acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
        }
    }
    for (int r = 0; r < nr; r++) {
        float *to = y + r * a->y_stride + offset;
        if (cols >= 16) {
            _mm256_storeu_ps(to, acc[r][0]);
            _mm256_storeu_ps(to + 8, acc[r][1]);
        } else if (cols > 0) {
            float row[16];
            _mm256_storeu_ps(row, acc[r][0]);
            _mm256_storeu_ps(row + 8, acc[r][1]);
            memcpy(to, row, sizeof(float) * (size_t)cols);
        }
    }
}

/* `nr` rows (at most 3, a constant at each call) against a whole panel: 4 accumulators a row, so a decode row keeps
   four independent chains in flight. */
AVX2_INLINE void panel_block_wide(const panel_args *a, const float *x, const void *panel, float *y, const int nr,
                                  int cols, const int bf16) {
    __m256 acc[3][4];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < a->k; i++) {
        const int64_t at = i * PANEL;
        const __m256 w0 = load8(panel, at, bf16), w1 = load8(panel, at + 8, bf16), w2 = load8(panel, at + 16, bf16),
                     w3 = load8(panel, at + 24, bf16);
        for (int r = 0; r < nr; r++) {
            const __m256 xv = _mm256_broadcast_ss(x + r * a->x_stride + i);
            acc[r][0] = _mm256_fmadd_ps(xv, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(xv, w1, acc[r][1]);
            acc[r][2] = _mm256_fmadd_ps(xv, w2, acc[r][2]);
            acc[r][3] = _mm256_fmadd_ps(xv, w3, acc[r][3]);
        }
    }
    for (int r = 0; r < nr; r++) {
        float row[PANEL];
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(row + 8 * c, acc[r][c]);
        memcpy(y + r * a->y_stride, row, sizeof(float) * (size_t)cols);
    }
}

AVX2_INLINE void panel_rows(const panel_args *a, int thread, int threads, const int bf16) {
    const int64_t first = a->num_panels * thread / threads, last = a->num_panels * (thread + 1) / threads;
    const size_t panel_elements = (size_t)a->k * PANEL;
    for (int64_t m0 = 0; m0 < a->rows; m0 += ROW_TILE) {
        const int64_t m1 = m0 + ROW_TILE < a->rows ? m0 + ROW_TILE : a->rows;
        for (int64_t p = first; p < last; p++) {
            const void *panel = element(a->panels, (int64_t)(p * panel_elements), bf16);
            const int cols = a->n - p * PANEL < PANEL ? (int)(a->n - p * PANEL) : PANEL;
            if (m1 - m0 <= 3) { /* a few rows (decode steps): every column of the panel at once */
                const float *x = a->x + m0 * a->x_stride;
                float *y = a->y + m0 * a->y_stride + p * PANEL;
                switch ((int)(m1 - m0)) {
                case 3: panel_block_wide(a, x, panel, y, 3, cols, bf16); break;
                case 2: panel_block_wide(a, x, panel, y, 2, cols, bf16); break;
                default: panel_block_wide(a, x, panel, y, 1, cols, bf16); break;
                }
                continue;
            }
            for (int half = 0; half < 2 && 16 * half < cols; half++)
                for (int64_t m = m0; m < m1; m += ROW_BLOCK) {
                    const float *x = a->x + m * a->x_stride;
                    float *y = a->y + m * a->y_stride + p * PANEL;
                    const int left = cols - 16 * half;
                    switch (m1 - m >= ROW_BLOCK ? ROW_BLOCK : (int)(m1 - m)) {
                    case 6: panel_block(a, x, panel, half, y, 6, left, bf16); break;
                    case 5: panel_block(a, x, panel, half, y, 5, left, bf16); break;
                    case 4: panel_block(a, x, panel, half, y, 4, left, bf16); break;
                    case 3: panel_block(a, x, panel, half, y, 3, left, bf16); break;
                    case 2: panel_block(a, x, panel, half, y, 2, left, bf16); break;
                    default: panel_block(a, x, panel, half, y, 1, left, bf16); break;
                    }
                }
        }
    }
}

AVX2 static void panel_worker(void *data, int thread, int threads) {
    const panel_args *a = (const panel_args *)data;
    if (a->bf16) panel_rows(a, thread, threads, 1);
    else panel_rows(a, thread, threads, 0);
}

PyObject *py_panel_linear(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t x, panels, y, rows, n, k, x_stride, y_stride;
    int bf16, threads;
    if (!PyArg_ParseTuple(args, "nnnnnnnnpi", &x, &panels, &y, &rows, &n, &k, &x_stride, &y_stride, &bf16, &threads))
        return NULL;
    panel_args a = {(const float *)x, (const void *)panels, (float *)y, rows, n, k, x_stride, y_stride,
                    (n + PANEL - 1) / PANEL, bf16};
    if (threads > a.num_panels) threads = (int)a.num_panels;
    count_path(PATH_INVARIANT_MATMUL);
    Py_BEGIN_ALLOW_THREADS
    run_parallel(panel_worker, &a, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Attention. blocks [num_blocks][4]: (row of `slots` holding the sequence's slot table, first query row, rows (at
 * most QUERY_BLOCK), the first row's context); row r of a block attends the table's first context + r slots. q rows
 * hold heads x head_dim floats (q_stride floats apart), out rows likewise (out_stride); the pool layer is
 * [num_slots][kv_heads][head_dim].
 * ------------------------------------------------------------------------------------------------------------- */
typedef struct {
    const float *q;
    const void *k, *v;
    const int64_t *slots, *blocks;
    float *out;
    float *workspace; /* per thread: longest + 8 floats */
    int64_t q_stride, out_stride, slots_stride, num_blocks, heads, kv_heads, head_dim, longest;
    float scale;
    int bf16;
} attend_args;

/* The head's query (`dim` floats, in registers) against one key: an 8-lane partial sum over the dims in order, then
   sum8. Every score of every row is this sequence. */
#define MAX_DIM_VECTORS 32 /* head_dim up to 256 */

AVX2_INLINE float dot_key(const __m256 *q, const void *key, const int dim, const int bf16) {
    __m256 acc = _mm256_setzero_ps();
    for (int d = 0; d < dim; d += 8) acc = _mm256_fmadd_ps(q[d / 8], load8(key, d, bf16), acc);
    return sum8(acc);
}

/* One query row's head attending the first `context` slots of `table` in KV head h (`dim` a constant at each call):
   scores (four keys at a time, each its own chain, so the order per key is dot_key's), the exact max, exp and the
   key-ordered 8-lane sum of the probabilities, then the key-ordered weighted sum of the values, divided by the sum. */
AVX2_INLINE void attend_row(const attend_args *a, const int64_t *table, int64_t context, int64_t h, const float *query,
                            float *out, float *scores, const int dim, const int bf16) {
    const int64_t slot_width = a->kv_heads * dim, base = h * dim;
    __m256 q[MAX_DIM_VECTORS];
    for (int d = 0; d < dim; d += 8) q[d / 8] = _mm256_loadu_ps(query + d);
    int64_t j = 0;
    for (; j + 4 <= context; j += 4) {
        const void *k0 = element(a->k, table[j] * slot_width + base, bf16);
        const void *k1 = element(a->k, table[j + 1] * slot_width + base, bf16);
        const void *k2 = element(a->k, table[j + 2] * slot_width + base, bf16);
        const void *k3 = element(a->k, table[j + 3] * slot_width + base, bf16);
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
        for (int d = 0; d < dim; d += 8) {
            s0 = _mm256_fmadd_ps(q[d / 8], load8(k0, d, bf16), s0);
            s1 = _mm256_fmadd_ps(q[d / 8], load8(k1, d, bf16), s1);
            s2 = _mm256_fmadd_ps(q[d / 8], load8(k2, d, bf16), s2);
            s3 = _mm256_fmadd_ps(q[d / 8], load8(k3, d, bf16), s3);
        }
        scores[j] = sum8(s0) * a->scale;
        scores[j + 1] = sum8(s1) * a->scale;
        scores[j + 2] = sum8(s2) * a->scale;
        scores[j + 3] = sum8(s3) * a->scale;
    }
    for (; j < context; j++)
        scores[j] = dot_key(q, element(a->k, table[j] * slot_width + base, bf16), dim, bf16) * a->scale;
    float top = -INFINITY;
    for (j = 0; j < context; j++) top = scores[j] > top ? scores[j] : top;
    const __m256 shift = _mm256_set1_ps(top);
    __m256 total = _mm256_setzero_ps();
    for (j = 0; j < context; j += 8) {
        const __m256i lanes = _mm256_add_epi32(_mm256_set1_epi32((int)j), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 real = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)context), lanes));
        const __m256 p = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + j), shift)), real);
        _mm256_storeu_ps(scores + j, p);
        total = _mm256_add_ps(total, p);
    }
    const __m256 sum = _mm256_set1_ps(sum8(total));
    __m256 acc[MAX_DIM_VECTORS];
    for (int d = 0; d < dim; d += 8) acc[d / 8] = _mm256_setzero_ps();
    for (j = 0; j < context; j++) {
        const void *value = element(a->v, table[j] * slot_width + base, bf16);
        const __m256 p = _mm256_broadcast_ss(scores + j);
        for (int d = 0; d < dim; d += 8) acc[d / 8] = _mm256_fmadd_ps(p, load8(value, d, bf16), acc[d / 8]);
    }
    for (int d = 0; d < dim; d += 8) _mm256_storeu_ps(out + d, _mm256_div_ps(acc[d / 8], sum));
}

/* One block of query rows against KV head h: each row and head of the group in turn. `scores`: longest + 8 floats. */
AVX2_INLINE void attend_block(const attend_args *a, const int64_t *block, int64_t h, float *scores, const int dim,
                              const int bf16) {
    const int64_t *table = a->slots + block[0] * a->slots_stride;
    const int64_t group = a->heads / a->kv_heads;
    for (int64_t r = 0; r < block[2]; r++)
        for (int64_t g = 0; g < group; g++) {
            const int64_t head = h * group + g, row = block[1] + r;
            attend_row(a, table, block[3] + r, h, a->q + row * a->q_stride + head * dim,
                       a->out + row * a->out_stride + head * dim, scores, dim, bf16);
        }
}

AVX2 static void attend_worker(void *data, int thread, int threads) {
    const attend_args *a = (const attend_args *)data;
    const int64_t items = a->num_blocks * a->kv_heads;
    float *scores = a->workspace + (size_t)thread * (size_t)(a->longest + 8);
    for (int64_t item = thread; item < items; item += threads) {
        const int64_t *block = a->blocks + (item / a->kv_heads) * 4, h = item % a->kv_heads;
        /* head_dim a constant where it is a common one, so the query and accumulators stay in registers */
        if (a->head_dim == 64) {
            if (a->bf16) attend_block(a, block, h, scores, 64, 1);
            else attend_block(a, block, h, scores, 64, 0);
        } else if (a->head_dim == 128) {
            if (a->bf16) attend_block(a, block, h, scores, 128, 1);
            else attend_block(a, block, h, scores, 128, 0);
        } else if (a->bf16) {
            attend_block(a, block, h, scores, (int)a->head_dim, 1);
        } else {
            attend_block(a, block, h, scores, (int)a->head_dim, 0);
        }
    }
}

PyObject *py_invariant_attention(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t q, q_stride, k, v, slots, slots_stride, blocks, num_blocks, out, out_stride, heads, kv_heads, head_dim,
        longest, workspace;
    float scale;
    int bf16, threads;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnnnnnnfpni", &q, &q_stride, &k, &v, &slots, &slots_stride, &blocks,
                          &num_blocks, &out, &out_stride, &heads, &kv_heads, &head_dim, &longest, &scale, &bf16,
                          &workspace, &threads))
        return NULL;
    if (kv_heads < 1 || heads % kv_heads || head_dim % 8 || head_dim > 8 * MAX_DIM_VECTORS) {
        PyErr_SetString(PyExc_ValueError, "invariant attention takes whole GQA groups and head_dim % 8 == 0, <= 256");
        return NULL;
    }
    attend_args a = {(const float *)q, (const void *)k, (const void *)v, (const int64_t *)slots,
                     (const int64_t *)blocks, (float *)out, (float *)workspace, q_stride, out_stride, slots_stride,
                     num_blocks, heads, kv_heads, head_dim, longest, scale, bf16};
    if (threads > num_blocks * kv_heads) threads = (int)(num_blocks * kv_heads);
    count_path(PATH_INVARIANT_ATTENTION);
    Py_BEGIN_ALLOW_THREADS
    run_parallel(attend_worker, &a, threads < 1 ? 1 : threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
