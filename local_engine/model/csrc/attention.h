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

/* A segment's fields, unpacked: positions [t0, t1) of the slot table `slots`, attended by the queries of `count` rows
   (`rows`), whose partial records start at `partial`. */
typedef struct {
    const int64_t *slots, *rows;
    float *partial;
    int64_t count, t0, t1;
} segment_view;

static inline segment_view view_segment(const attention_args *a, int64_t segment) {
    const int64_t *seg = a->segments + segment * SEGMENT_FIELDS;
    const segment_view view = {a->slots + seg[TABLE_ROW] * a->stride, a->seg_rows + seg[FIRST_ROW],
                               a->partial + a->partial_offset[segment], seg[ROW_COUNT], seg[FIRST_POSITION],
                               seg[END_POSITION]};
    return view;
}

/* Query j of KV head h in the segment (j over its rows' queries of that head: rows x heads / kv_heads). */
static inline const float *segment_query(const attention_args *a, const segment_view *s, int64_t h, int64_t j) {
    const int64_t group = a->heads / a->kv_heads;
    return a->q + s->rows[j / group] * a->q_stride + (h * group + j % group) * a->head_dim;
}

/* The partial record (output, maximum, sum) that query j of KV head h accumulates into. */
static inline float *segment_record(const attention_args *a, const segment_view *s, int64_t h, int64_t j) {
    const int64_t group = a->heads / a->kv_heads;
    return s->partial + ((j / group) * a->heads + h * group + j % group) * (a->head_dim + 2);
}

/* Where KV head h of the token in `slot` lies in a pool layer. */
static inline const void *pool_at(const attention_args *a, const void *pool, int64_t slot, int64_t h, const int bf16) {
    return element(pool, (slot * a->kv_heads + h) * a->head_dim, bf16);
}

/* A KV head read by fewer queries takes attend_few's path where the CPU has AVX-512 and head_dim is a multiple of 32,
   else the AVX2 path. */
#define MIN_GROUP_QUERIES 8

/* The partial records of `a`'s segments for `rows` rows, allocated once for every layer of a step
   (attention_reserve: 0, or -1 when out of memory) and freed by attention_release. */
int attention_reserve(attention_args *a, int64_t rows);
/* Whether a decode plan stays inside its rows, tables and pool: each segment reads positions within the `stride`
   of a table row below `rows`, for rows listed within `seg_rows` (`num_seg_rows` entries, each below `rows`), and
   every slot of the tables `[rows, stride]` (padding included) lies in a pool of `num_slots`. */
int plan_valid(const int64_t *slots, int64_t rows, int64_t stride, const int64_t *segments, int64_t num_segments,
               const int64_t *seg_rows, int64_t num_seg_rows, int64_t num_slots);
void attention_release(attention_args *a);

/* Attends every segment of `a` (its records reserved) on `threads` threads and merges each row's parts into `out`
   (contiguous [rows, heads, head_dim]). */
void attend_decode(attention_args *a, float *out, int64_t rows, int threads);

/* Whether the kernel takes this shape: head_dim a multiple of 8 and at most MAX_HEAD_DIM, heads a multiple of
   kv_heads. */
int attention_shape_supported(int64_t heads, int64_t kv_heads, int64_t head_dim);

/* Attends segment `segment` with 512-bit vectors (attention_wide.c); on a CPU with AVX-512F and BW only. */
void attend_group_avx512(const attention_args *a, int64_t segment);

/* The same for a segment whose KV head is read by fewer than MIN_GROUP_QUERIES queries (its buffers hold that many),
   head_dim a multiple of 32 (attention_wide.c). */
void attend_few_avx512(const attention_args *a, int64_t segment);

#endif
