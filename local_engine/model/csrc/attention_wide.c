/*
 * Decode attention's segments with 512-bit vectors, for a KV head read by many queries (rows sharing a prefix, or a
 * wide GQA group) on a CPU with AVX-512F (every CPU with native bf16 has it): the head's queries are transposed once
 * per segment, with the scale folded in, so that each key element, broadcast, meets 16 queries per FMA. Scores come
 * out as [key][query] vectors with no horizontal sums, the online softmax runs across 16 queries per instruction, and
 * values are accumulated for 4 queries at a time, each value vector loaded once for them.
 */
#include "attention.h"

#define GROUP_QUERIES 32 /* a KV head's queries attended together: two vectors */

AVX512_INLINE void attend_group(const attention_args *a, int64_t segment, const int bf16) {
    const segment_view s = view_segment(a, segment);
    const int64_t d = a->head_dim, group = a->heads / a->kv_heads, count = s.count, t0 = s.t0, t1 = s.t1;
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
            out[j] = spare[j % 4]; /* a missing query of a tile of 4: its zero scores go nowhere */
            if (j < queries) {
                q = segment_query(a, &s, h, j0 + j);
                out[j] = segment_record(a, &s, h, j0 + j);
            }
            memset(out[j], 0, sizeof(float) * d);
            for (int64_t i = 0; i < d; i++) queries_t[i][j] = q != NULL ? q[i] * a->scale : 0.0f;
            row_max[j] = -INFINITY;
            row_sum[j] = 0.0f;
        }
        for (int64_t b0 = t0; b0 < t1; b0 += BLOCK) {
            const int64_t n = t1 - b0 < BLOCK ? t1 - b0 : BLOCK;
            const void *key[BLOCK + 3];
            const float *value[BLOCK];
            for (int64_t t = 0; t < n; t++) {
                key[t] = pool_at(a, a->k, s.slots[b0 + t], h, bf16);
                const void *stored = pool_at(a, a->v, s.slots[b0 + t], h, bf16);
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

AVX512 void attend_group_avx512(const attention_args *a, int64_t segment) {
    if (a->bf16) attend_group(a, segment, 1);
    else attend_group(a, segment, 0);
}

