/* Decode attention over the paged pool (local_engine.model.cpu_kernels.decode_attention): the AVX2 path, the
   segments' scheduling and their merge. */
#include "attention.h"

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

AVX2_INLINE void attend_segment(const attention_args *a, int64_t segment, const int bf16) {
    const segment_view s = view_segment(a, segment);
    const int64_t d = a->head_dim, group = a->heads / a->kv_heads, count = s.count, t0 = s.t0, t1 = s.t1;
    float scores[MAX_QUERIES][BLOCK] __attribute__((aligned(32)));
    const float *query[MAX_QUERIES];
    float *acc[MAX_QUERIES];
    /* Up to MAX_QUERIES queries at a time: one KV head's queries of all the segment's rows, or a part of them. */
    for (int64_t h = 0; h < a->kv_heads; h++)
    for (int64_t j0 = 0; j0 < count * group; j0 += MAX_QUERIES) {
        const int64_t queries = count * group - j0 < MAX_QUERIES ? count * group - j0 : MAX_QUERIES;
        for (int64_t j = 0; j < queries; j++) {
            query[j] = segment_query(a, &s, h, j0 + j);
            acc[j] = segment_record(a, &s, h, j0 + j);
            memset(acc[j], 0, sizeof(float) * d);
            acc[j][d] = -INFINITY;
            acc[j][d + 1] = 0.0f;
        }
        for (int64_t b0 = t0; b0 < t1; b0 += BLOCK) {
            const int64_t n = t1 - b0 < BLOCK ? t1 - b0 : BLOCK;
            const void *key[BLOCK], *value[BLOCK];
            for (int64_t t = 0; t < n; t++) {
                key[t] = pool_at(a, a->k, s.slots[b0 + t], h, bf16);
                value[t] = pool_at(a, a->v, s.slots[b0 + t], h, bf16);
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

AVX2 static void attention_part(void *data, int thread, int threads) {
    (void)thread, (void)threads;
    attention_args *a = (attention_args *)data;
    for (;;) {
        const int64_t segment = __atomic_fetch_add(&a->next, 1, __ATOMIC_RELAXED);
        if (segment >= a->num_segments) return;
        const int64_t queries = a->segments[segment * SEGMENT_FIELDS + ROW_COUNT] * (a->heads / a->kv_heads);
        if (avx512_enabled && a->head_dim % 16 == 0 && queries >= MIN_GROUP_QUERIES) {
            attend_group_avx512(a, segment);
        } else if (avx512_enabled && a->head_dim % 32 == 0) { /* fewer than MIN_GROUP_QUERIES, as it requires */
            attend_few_avx512(a, segment);
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
    for (int64_t segment = 0; segment < a->num_segments; segment++) {
        const segment_view s = view_segment(a, segment);
        for (int64_t j = 0; j < s.count; j++)
            for (int64_t head = 0; head < a->heads; head++) {
                const float *part = s.partial + (j * a->heads + head) * record;
                if (part[d] == -INFINITY) continue; /* an empty segment */
                const int64_t at = s.rows[j] * a->heads + head;
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

int attention_reserve(attention_args *a, int64_t rows) {
    const int64_t record = a->head_dim + 2;
    int64_t *offset = malloc(sizeof(int64_t) * (size_t)(a->num_segments + 1));
    if (offset == NULL) return -1;
    offset[0] = 0;
    for (int64_t s = 0; s < a->num_segments; s++)
        offset[s + 1] = offset[s] + a->segments[s * SEGMENT_FIELDS + ROW_COUNT] * a->heads * record;
    float *partial = malloc(sizeof(float) * (size_t)(offset[a->num_segments] + 2 * rows * a->heads));
    if (partial == NULL) {
        free(offset);
        return -1;
    }
    a->partial_offset = offset;
    a->partial = partial;
    return 0;
}

void attention_release(attention_args *a) {
    free(a->partial);
    free((int64_t *)a->partial_offset);
    a->partial = NULL;
    a->partial_offset = NULL;
}

void attend_decode(attention_args *a, float *out, int64_t rows, int threads) {
    a->next = 0;
    float *row_max = a->partial + a->partial_offset[a->num_segments], *row_sum = row_max + rows * a->heads;
    run_parallel(attention_part, a, threads < a->num_segments ? threads : (int)a->num_segments);
    merge_segments(a, out, row_max, row_sum, rows);
}

int attention_shape_supported(int64_t heads, int64_t kv_heads, int64_t head_dim) {
    return head_dim % 8 == 0 && head_dim <= MAX_HEAD_DIM && kv_heads > 0 && heads % kv_heads == 0;
}

int plan_valid(const int64_t *slots, int64_t rows, int64_t stride, const int64_t *segments, int64_t num_segments,
               const int64_t *seg_rows, int64_t num_seg_rows, int64_t num_slots) {
    if (rows < 1 || stride < 1 || num_segments < 0 || !slots_in_pool(slots, rows * stride, num_slots)) return 0;
    for (int64_t r = 0; r < num_seg_rows; r++)
        if (seg_rows[r] < 0 || seg_rows[r] >= rows) return 0;
    for (int64_t s = 0; s < num_segments; s++) {
        const int64_t *seg = segments + s * SEGMENT_FIELDS;
        if (seg[TABLE_ROW] < 0 || seg[TABLE_ROW] >= rows || seg[FIRST_POSITION] < 0 ||
            seg[FIRST_POSITION] > seg[END_POSITION] || seg[END_POSITION] > stride || seg[FIRST_ROW] < 0 ||
            seg[ROW_COUNT] < 1 || seg[ROW_COUNT] > num_seg_rows - seg[FIRST_ROW])
            return 0;
    }
    return 1;
}

PyObject *py_decode_attention(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t q, q_stride, k, v, num_slots, slots, segments, seg_rows, num_seg_rows, out, rows, stride, num_segments,
        heads, kv_heads, head_dim;
    float scale;
    int bf16, threads;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnnnnnnnnfpi", &q, &q_stride, &k, &v, &num_slots, &slots, &segments, &seg_rows,
                          &num_seg_rows, &out, &rows, &stride, &num_segments, &heads, &kv_heads, &head_dim, &scale,
                          &bf16, &threads))
        return NULL;
    if (!attention_shape_supported(heads, kv_heads, head_dim)) {
        PyErr_SetString(PyExc_ValueError, "unsupported attention shape");
        return NULL;
    }
    if (!plan_valid((const int64_t *)slots, rows, stride, (const int64_t *)segments, num_segments,
                    (const int64_t *)seg_rows, num_seg_rows, num_slots)) {
        PyErr_SetString(PyExc_IndexError, "the decode plan reads outside its rows, its slot tables or the pool");
        return NULL;
    }
    attention_args a = {(const float *)q, (const void *)k, (const void *)v, (const int64_t *)slots,
                        (const int64_t *)segments, (const int64_t *)seg_rows, NULL, NULL, q_stride, stride,
                        num_segments, heads, kv_heads, head_dim, scale, bf16, 0};
    if (attention_reserve(&a, rows) != 0) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    attend_decode(&a, (float *)out, rows, threads);
    Py_END_ALLOW_THREADS
    attention_release(&a);
    Py_RETURN_NONE;
}
