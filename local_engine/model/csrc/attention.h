/* What the two decode-attention paths share: the segments they read and the partial results they leave. */
#ifndef PREFIXSCOPE_ATTENTION_H
#define PREFIXSCOPE_ATTENTION_H

#include "cpu_kernels.h"

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

#define MIN_GROUP_QUERIES 8 /* a KV head read by fewer queries takes the AVX2 path, whose vectors run along head_dim */

/* Attends segment `segment` with 512-bit vectors (attention_wide.c); on a CPU with AVX-512F only. */
void attend_group_avx512(const attention_args *a, int64_t segment);

#endif
