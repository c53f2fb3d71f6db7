/*
 * Decode attention's segments with 512-bit vectors, on a CPU with AVX-512F and BW (every CPU with native bf16 has
 * them), in two shapes. For a KV head read by many queries (rows sharing a prefix, or a wide GQA group), the head's
 * queries are transposed once per segment, with the scale folded in, so that each key element, broadcast, meets 16
 * queries per FMA. Scores come out as [key][query] vectors with no horizontal sums, the online softmax runs across 16
 * queries per instruction, and values are accumulated for 4 queries at a time, each value vector loaded once for
 * them. For a few queries (attend_few, below), the vectors run along head_dim.
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


/* ---------------------------------------------------------------------------------------------------------------
 * The same for a KV head read by a few queries (one row's GQA group, or a few rows sharing a prefix), with vectors
 * along head_dim. bfloat16 keys and values are widened by unpacking each 32 stored elements against zeros, one
 * instruction per 16 floats, which leaves them in another order (per 128-bit lane of 8 elements, the first 4 in one
 * vector, the last 4 in the other): the queries are put in that order, the outputs accumulate in it and are put
 * back at the end. A query's scores of 16 keys come out of 16 accumulators at once by a tree of shuffles; the online
 * softmax and the value sums go on blocks of 64 keys. Each block is read for every KV head before the next (a token's
 * heads lie side by side in the pool, so the segment is one stream), and the next block is asked for into L2 while
 * this one is scored, where the hint into L1 was dropped. For one row on a 2,000-token context, 30 layers of
 * SmolLM2's shape in bf16 on one thread of a 2-core EPYC, the loads of an earlier version waited on memory two thirds
 * of the time: asking into L2 took it from 10.4-10.8 ms to 7.0-8.1, and 64-key softmax blocks (fewer chains of
 * reductions) this kernel to 4.7-4.9, where the AVX2 path takes 9.7-10.8.
 * ------------------------------------------------------------------------------------------------------------- */
#define FEW_KEYS 16     /* keys scored by one tree of sums */
#define FEW_BLOCK 64    /* keys per step of the online softmax */

/* out[t] = the sum of v[t]'s 16 lanes, for t < 16: pairs, then quads, then 128-bit lanes are summed together. */
AVX512_INLINE __m512 sum_each(const __m512 v[FEW_KEYS]) {
    __m512 pair[8], quad[4], half[2];
    for (int k = 0; k < 8; k++) /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] */
        pair[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]),
                                _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 4; k++) /* per 128-bit lane: [a, b, c, d], each a quarter of its sum */
        quad[k] = _mm512_add_ps(_mm512_shuffle_ps(pair[2 * k], pair[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm512_shuffle_ps(pair[2 * k], pair[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int k = 0; k < 2; k++) /* lanes [x.L0 + x.L1, x.L2 + x.L3, y.L0 + y.L1, y.L2 + y.L3] */
        half[k] = _mm512_add_ps(_mm512_shuffle_f32x4(quad[2 * k], quad[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_f32x4(quad[2 * k], quad[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(half[0], half[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(half[0], half[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The permutation (for _mm512_permutex2var_ps over two vectors of 16) from 32 stored elements to load32's order for
   bfloat16, and back. */
AVX512_INLINE __m512i permutation(int part, int back) {
    int32_t index[16];
    for (int k = 0; k < 16; k++) index[k] = back ? STORED(16 * part + k) : UNPACKED(k) + 4 * part;
    return _mm512_loadu_si512(index);
}

/* Asks for KV head h of the K and V of the `count` tokens from position b0 of the segment to be brought into L2 (into
   L1, the hint was dropped). */
AVX512_INLINE void prefetch_head(const attention_args *a, const segment_view *s, int64_t b0, int64_t count, int64_t h,
                                 const int bf16) {
    const int64_t end = b0 + count < s->t1 ? b0 + count : s->t1;
    const int64_t bytes = a->head_dim * (bf16 ? 2 : 4);
    for (int64_t t = b0; t < end; t++) {
        const char *k = (const char *)pool_at(a, a->k, s->slots[t], h, bf16);
        const char *v = (const char *)pool_at(a, a->v, s->slots[t], h, bf16);
        for (int64_t line = 0; line < bytes; line += 64) {
            _mm_prefetch(k + line, _MM_HINT_T1);
            _mm_prefetch(v + line, _MM_HINT_T1);
        }
    }
}

/* The softmax-weighted values of one block for `tile` queries (1 to 4), accumulated into their records: `pairs` x 32
   dimensions from i0, in up to 16 registers. */
AVX512_INLINE void add_values_at(const void *const *value, int64_t n, float *const *out,
                                 const float (*probs)[FEW_BLOCK], const float *rescale, int64_t i0, const int pairs,
                                 const int tile, const int bf16) {
    __m512 x[4][4];
    for (int q = 0; q < tile; q++)
        for (int w = 0; w < 2 * pairs; w++)
            x[q][w] = _mm512_mul_ps(_mm512_loadu_ps(out[q] + i0 + 16 * w), _mm512_set1_ps(rescale[q]));
    for (int64_t u = 0; u < n; u++)
        for (int w = 0; w < pairs; w++) {
            __m512 first, second;
            load32(value[u], i0 + 32 * w, &first, &second, bf16);
            for (int q = 0; q < tile; q++) {
                const __m512 p = _mm512_set1_ps(probs[q][u]);
                x[q][2 * w] = _mm512_fmadd_ps(p, first, x[q][2 * w]);
                x[q][2 * w + 1] = _mm512_fmadd_ps(p, second, x[q][2 * w + 1]);
            }
        }
    for (int q = 0; q < tile; q++)
        for (int w = 0; w < 2 * pairs; w++) _mm512_storeu_ps(out[q] + i0 + 16 * w, x[q][w]);
}

AVX512_INLINE void add_values(int64_t d, const void *const *value, int64_t n, float *const *out,
                              const float (*probs)[FEW_BLOCK], const float *rescale, const int tile, const int bf16) {
    int64_t i0 = 0;
    for (; i0 + 64 <= d; i0 += 64) add_values_at(value, n, out, probs, rescale, i0, 2, tile, bf16);
    if (i0 < d) add_values_at(value, n, out, probs, rescale, i0, 1, tile, bf16);
}

AVX512_INLINE void attend_few(const attention_args *a, int64_t segment, const int bf16) {
    const segment_view s = view_segment(a, segment);
    const int64_t d = a->head_dim, group = a->heads / a->kv_heads, queries = s.count * group;
    float query[MAX_HEAD_DIM] __attribute__((aligned(64))); /* scaled, in load32's order */
    float probs[MIN_GROUP_QUERIES][FEW_BLOCK] __attribute__((aligned(64)));
    float rescale[MIN_GROUP_QUERIES];
    const __m512i to_unpacked[2] = {permutation(0, 0), permutation(1, 0)};
    const __m512i to_stored[2] = {permutation(0, 1), permutation(1, 1)};
    for (int64_t h = 0; h < a->kv_heads; h++)
        for (int64_t j = 0; j < queries; j++) {
            float *record = segment_record(a, &s, h, j);
            memset(record, 0, sizeof(float) * d);
            record[d] = -INFINITY; /* the running maximum, then the sum */
            record[d + 1] = 0.0f;
        }
    for (int64_t h = 0; h < a->kv_heads; h++) prefetch_head(a, &s, s.t0, FEW_BLOCK, h, bf16);
    for (int64_t b0 = s.t0; b0 < s.t1; b0 += FEW_BLOCK) {
        const int64_t n = s.t1 - b0 < FEW_BLOCK ? s.t1 - b0 : FEW_BLOCK;
        const int trees = (int)((n + FEW_KEYS - 1) / FEW_KEYS);
        for (int64_t h = 0; h < a->kv_heads; h++) {
            float *out[MIN_GROUP_QUERIES];
            const void *key[FEW_BLOCK], *value[FEW_BLOCK];
            for (int64_t t = 0; t < FEW_BLOCK; t++) { /* missing keys repeat the first */
                key[t] = pool_at(a, a->k, s.slots[b0 + (t < n ? t : 0)], h, bf16);
                value[t] = pool_at(a, a->v, s.slots[b0 + (t < n ? t : 0)], h, bf16);
            }
            for (int64_t j = 0; j < queries; j++) {
                const float *q = segment_query(a, &s, h, j);
                out[j] = segment_record(a, &s, h, j);
                for (int64_t i = 0; i < d; i += 32) {
                    const __m512 low = _mm512_loadu_ps(q + i), high = _mm512_loadu_ps(q + i + 16);
                    for (int part = 0; part < 2; part++)
                        _mm512_store_ps(query + i + 16 * part,
                                        _mm512_mul_ps(bf16 ? _mm512_permutex2var_ps(low, to_unpacked[part], high)
                                                           : part ? high : low,
                                                      _mm512_set1_ps(a->scale)));
                }
                __m512 scores[FEW_BLOCK / FEW_KEYS];
                __mmask16 real[FEW_BLOCK / FEW_KEYS];
                __m512 top = _mm512_set1_ps(-INFINITY);
                for (int tree = 0; tree < trees; tree++) {
                    const int64_t first = tree * FEW_KEYS;
                    /* The next block's keys and values of this head start arriving, a tree's worth at a time. */
                    if (j == 0) prefetch_head(a, &s, b0 + FEW_BLOCK + first, FEW_KEYS, h, bf16);
                    __m512 acc[FEW_KEYS];
                    for (int t = 0; t < FEW_KEYS; t++) acc[t] = _mm512_setzero_ps();
                    for (int64_t i = 0; i < d; i += 32) {
                        const __m512 q0 = _mm512_load_ps(query + i), q1 = _mm512_load_ps(query + i + 16);
                        for (int t = 0; t < FEW_KEYS; t++) {
                            __m512 lo, hi;
                            load32(key[first + t], i, &lo, &hi, bf16);
                            acc[t] = _mm512_fmadd_ps(hi, q1, _mm512_fmadd_ps(lo, q0, acc[t]));
                        }
                    }
                    const int64_t real_keys = n - first < FEW_KEYS ? n - first : FEW_KEYS;
                    real[tree] = (__mmask16)((1u << real_keys) - 1);
                    scores[tree] = _mm512_mask_blend_ps(real[tree], _mm512_set1_ps(-INFINITY), sum_each(acc));
                    top = _mm512_max_ps(top, scores[tree]);
                }
                const float block_max = _mm512_reduce_max_ps(top), old_max = out[j][d];
                const float new_max = block_max > old_max ? block_max : old_max;
                __m512 total = _mm512_setzero_ps();
                for (int tree = 0; tree < trees; tree++) {
                    /* a missing key weighs 0; a NaN score stays NaN, as on the other paths */
                    const __m512 kept =
                        _mm512_maskz_mov_ps(real[tree], exp16(_mm512_sub_ps(scores[tree], _mm512_set1_ps(new_max))));
                    _mm512_store_ps(probs[j] + tree * FEW_KEYS, kept);
                    total = _mm512_add_ps(total, kept);
                }
                rescale[j] = expf(old_max - new_max); /* 0 for the first block: the maximum was -inf */
                out[j][d] = new_max;
                out[j][d + 1] = out[j][d + 1] * rescale[j] + _mm512_reduce_add_ps(total);
            }
            for (int64_t j = 0; j < queries; j += 4) {
                const int tile = queries - j < 4 ? (int)(queries - j) : 4;
                switch (tile) { /* one copy per tile width, its loops unrolled */
                case 1: add_values(d, value, n, out + j, probs + j, rescale + j, 1, bf16); break;
                case 2: add_values(d, value, n, out + j, probs + j, rescale + j, 2, bf16); break;
                case 3: add_values(d, value, n, out + j, probs + j, rescale + j, 3, bf16); break;
                default: add_values(d, value, n, out + j, probs + j, rescale + j, 4, bf16);
                }
            }
        }
    }
    if (bf16) /* the outputs back in the stored order */
        for (int64_t h = 0; h < a->kv_heads; h++)
            for (int64_t j = 0; j < queries; j++) {
                float *record = segment_record(a, &s, h, j);
                for (int64_t i = 0; i < d; i += 32) {
                    const __m512 first = _mm512_loadu_ps(record + i), second = _mm512_loadu_ps(record + i + 16);
                    _mm512_storeu_ps(record + i, _mm512_permutex2var_ps(first, to_stored[0], second));
                    _mm512_storeu_ps(record + i + 16, _mm512_permutex2var_ps(first, to_stored[1], second));
                }
            }
}

AVX512 void attend_few_avx512(const attention_args *a, int64_t segment) {
    if (a->bf16) attend_few(a, segment, 1);
    else attend_few(a, segment, 0);
}
