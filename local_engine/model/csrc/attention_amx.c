/*
 * Attention of a prefill chunk on Intel AMX (local_engine.model.cpu_kernels.chunk_attention): the few dozen tokens
 * a prompt still prefills after a long cached prefix, against that whole context in a bfloat16 pool.
 *
 * Per KV head, the queries of its GQA group (query head by query head, token by token) are rows, in blocks of 16.
 * The scores S = Q K^T come from TDPBF16PS on the queries rounded to bf16 (as torch's `.to(torch.bfloat16)` rounds
 * them for SDPA on the pool's dtype) against the keys, packed once per call into AMX's pair-interleaved layout. Each
 * row's softmax is exact (its maximum over the whole row first), in float32, under the chunk's causal mask: token i
 * of T sees the context's first C - T + i + 1 keys. The probabilities, rounded to bf16, multiply the values (packed
 * once per call too) with float32 sums, and each row is divided by its float32 sum: the arithmetic of torch's CPU
 * flash attention on bf16 inputs (bf16 products, float32 sums, probabilities rounded to bf16), in another order.
 *
 * Every tile is 16 rows of 64 bytes. Q K^T: queries in tmm0-3 (32 dims each), keys in tmm4, scores in tmm5 (and,
 * for head_dim up to 64, a second block's keys and scores in tmm6 and tmm7).
 * P V: outputs in tmm0-3 (16 dims each), probabilities in tmm4, values in tmm5. Tile layouts and TDPBF16PS: Intel
 * Architecture Instruction Set Extensions Programming Reference, chapter 3 (Intel AMX).
 */
#include "cpu_kernels.h"

/* AMX intrinsics came with GCC 11 and Clang 12: an older compiler builds the rest of the kernels, and this file says
   AMX is not usable. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define PREFIXSCOPE_AMX 1
#endif

#ifndef PREFIXSCOPE_AMX
int amx_usable(void) { return 0; }

PyObject *py_chunk_workspace(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    PyErr_SetString(PyExc_RuntimeError, "the CPU kernels were built without AMX");
    return NULL;
}

PyObject *py_chunk_attention(PyObject *self, PyObject *args) { return py_chunk_workspace(self, args); }
#else
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

#define ARCH_REQ_XCOMP_PERM 0x1023 /* arch_prctl: ask for an XSAVE feature's state (Linux 5.16+) */
#define XFEATURE_XTILEDATA 18
#define TILE_ROWS 16
#define TILE_BYTES 1024 /* 16 rows of 64 bytes */

/* Whether AMX-BF16 runs here: the CPU has it with AVX-512 F, BW, VL and BF16, and Linux grants the tile state. */
int amx_usable(void) {
    static int usable = -1;
    if (usable >= 0) return usable;
    unsigned a, b, c, d;
    __builtin_cpu_init();
    usable = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
             __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) /* AMX-TILE */ && (d >> 22 & 1) /* AMX-BF16 */ &&
             syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return usable;
}

static int64_t align64(int64_t bytes) { return (bytes + 63) & ~(int64_t)63; }

typedef struct {
    const float *q;        /* token i's query head h at q + i * q_stride + h * head_dim */
    int64_t q_stride;
    const uint16_t *k, *v; /* one pool layer, [num_slots, kv_heads, head_dim] bf16 */
    const int64_t *slots;  /* the context's slots, [context]; the chunk's tokens are its last `tokens` */
    float *out;            /* like q, with out_stride */
    int64_t out_stride, tokens, context, heads, kv_heads, head_dim;
    float scale;
    /* Derived by chunk_layout. Rows: group * tokens per KV head, row r being query head (r / tokens) of the group
       at token r % tokens. */
    int64_t group, rows, row_blocks, key_blocks, pair_blocks;
    int64_t keys_bytes, values_bytes, queries_bytes, scratch_bytes;
    uint8_t *keys, *values, *queries, *scratch;
} chunk_args;

/* How many of the context's keys row r sees: its token's position in the context, plus one (the causal mask). */
static inline int64_t keys_seen(const chunk_args *a, int64_t r) { return a->context - a->tokens + r % a->tokens + 1; }

/* Sizes of the workspace's parts; returns its bytes for `threads` threads. */
static int64_t chunk_layout(chunk_args *a, int threads) {
    const int64_t d = a->head_dim;
    a->group = a->heads / a->kv_heads;
    a->rows = a->group * a->tokens;
    a->row_blocks = (a->rows + TILE_ROWS - 1) / TILE_ROWS;
    a->key_blocks = (a->context + 15) / 16; /* Q K^T: 16 keys per tile */
    a->pair_blocks = (a->context + 31) / 32; /* P V: 32 keys (16 pairs) per tile */
    /* Keys: per KV head, block and 32 dims, a tile whose row p holds dims (2p, 2p + 1) of each of the 16 keys. */
    a->keys_bytes = align64(a->kv_heads * a->key_blocks * (d / 32) * TILE_BYTES);
    /* Values: per KV head and 32 keys, 16 rows whose dim e holds that dim of keys (2p, 2p + 1). */
    a->values_bytes = align64(a->kv_heads * a->pair_blocks * 16 * d * 4);
    a->queries_bytes = align64(a->kv_heads * a->row_blocks * TILE_ROWS * d * 2);
    /* Per thread: a row block's float32 scores, its bf16 probabilities and its float32 outputs. */
    a->scratch_bytes = align64(TILE_ROWS * a->pair_blocks * 32 * 4) + align64(TILE_ROWS * a->pair_blocks * 32 * 2) +
                       align64(TILE_ROWS * d * 4);
    return a->keys_bytes + a->values_bytes + a->queries_bytes + threads * a->scratch_bytes;
}

static const uint16_t zero_row[CHUNK_MAX_HEAD_DIM]; /* keys and values past the context */

static const uint16_t *kv_row(const chunk_args *a, const uint16_t *pool, int64_t j, int64_t h) {
    return j < a->context ? pool + (a->slots[j] * a->kv_heads + h) * a->head_dim : zero_row;
}

/* A 16 x 16 matrix of 32-bit elements, one row per vector, transposed in place: pairs of rows interleaved by 32 and
   then 64 bits within each 128-bit lane, then the lanes gathered by two rounds of VSHUFI32X4. */
AVX512_INLINE void transpose16(__m512i rows[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* u[4i + k], lane L: column 4L + k of rows 4i .. 4i + 3 */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        const __m512i even_low = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88); /* lanes 0 and 2 of each */
        const __m512i odd_low = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);  /* lanes 1 and 3 */
        const __m512i even_high = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        const __m512i odd_high = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
        rows[k] = _mm512_shuffle_i32x4(even_low, even_high, 0x88);
        rows[8 + k] = _mm512_shuffle_i32x4(even_low, even_high, 0xDD);
        rows[4 + k] = _mm512_shuffle_i32x4(odd_low, odd_high, 0x88);
        rows[12 + k] = _mm512_shuffle_i32x4(odd_low, odd_high, 0xDD);
    }
}

/* One KV head's 32 keys and values from block `block`, into their tile layouts. */
AMX static void pack_keys_values(const chunk_args *a, int64_t h, int64_t block) {
    const int64_t d = a->head_dim, steps = d / 32;
    uint32_t *values = (uint32_t *)(a->values + (h * a->pair_blocks + block) * 16 * d * 4);
    for (int64_t p = 0; p < 16; p++) {
        const uint16_t *even = kv_row(a, a->v, block * 32 + 2 * p, h);
        const uint16_t *odd = kv_row(a, a->v, block * 32 + 2 * p + 1, h);
        for (int64_t e = 0; e < d; e += 16) {
            const __m512i low = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(even + e)));
            const __m512i high = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(odd + e)));
            _mm512_storeu_si512(values + p * d + e, _mm512_or_si512(low, _mm512_slli_epi32(high, 16)));
        }
    }
    for (int64_t kb = 2 * block; kb < 2 * block + 2 && kb < a->key_blocks; kb++) {
        uint32_t *keys = (uint32_t *)(a->keys + (h * a->key_blocks + kb) * steps * TILE_BYTES);
        const uint32_t *key[16]; /* each key as bf16 pairs */
        for (int64_t n = 0; n < 16; n++) key[n] = (const uint32_t *)kv_row(a, a->k, kb * 16 + n, h);
        for (int64_t step = 0; step < steps; step++) { /* tile `step`, row p: pair 16 * step + p of the 16 keys */
            __m512i rows[16];
            for (int n = 0; n < 16; n++) rows[n] = _mm512_loadu_si512(key[n] + 16 * step);
            transpose16(rows);
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(keys + (16 * step + p) * 16, rows[p]);
        }
    }
}

/* One KV head's rows, rounded to bf16; rows past the last are zeros. */
static void pack_queries(const chunk_args *a, int64_t h) {
    const int64_t d = a->head_dim;
    uint16_t *queries = (uint16_t *)a->queries + h * a->row_blocks * TILE_ROWS * d;
    for (int64_t r = 0; r < a->row_blocks * TILE_ROWS; r++) {
        uint16_t *to = queries + r * d;
        if (r >= a->rows) {
            memset(to, 0, d * 2);
            continue;
        }
        const float *from = a->q + (r % a->tokens) * a->q_stride + (h * a->group + r / a->tokens) * d;
        for (int64_t e = 0; e < d; e++) to[e] = to_bf16(from[e]);
    }
}

static void pack_part(void *data, int thread, int threads) {
    const chunk_args *a = (const chunk_args *)data;
    const int64_t per_head = a->pair_blocks + 1, items = a->kv_heads * per_head;
    for (int64_t item = thread; item < items; item += threads) {
        const int64_t h = item / per_head, block = item % per_head;
        if (block == a->pair_blocks) pack_queries(a, h);
        else pack_keys_values(a, h, block);
    }
}

/* Row block `rb` of KV head h: scores, softmax, outputs. */
AMX static void attend_rows(const chunk_args *a, int64_t h, int64_t rb, uint8_t *scratch) {
    const int64_t d = a->head_dim, steps = d / 32, first = rb * TILE_ROWS;
    const int64_t last = (first + TILE_ROWS < a->rows ? first + TILE_ROWS : a->rows) - 1;
    /* The block's rows see keys [0, context - tokens + token]: none reads past its furthest row's. */
    int64_t seen = 0;
    for (int64_t r = first; r <= last; r++) seen = keys_seen(a, r) > seen ? keys_seen(a, r) : seen;
    const int64_t key_blocks = (seen + 15) / 16, pair_blocks = (seen + 31) / 32, width = a->pair_blocks * 32;
    float *scores = (float *)scratch;
    uint16_t *probs = (uint16_t *)(scratch + align64(TILE_ROWS * width * 4));
    float *outputs = (float *)((uint8_t *)probs + align64(TILE_ROWS * width * 2));
    float sums[TILE_ROWS];

    const uint16_t *queries = (const uint16_t *)a->queries + (h * a->row_blocks + rb) * TILE_ROWS * d;
    _tile_loadd(0, queries, d * 2);
    if (steps > 1) _tile_loadd(1, queries + 32, d * 2);
    if (steps > 2) _tile_loadd(2, queries + 64, d * 2);
    if (steps > 3) _tile_loadd(3, queries + 96, d * 2);
    const uint8_t *keys = a->keys + h * a->key_blocks * steps * TILE_BYTES;
    int64_t kb = 0;
    if (steps <= 2) /* two blocks at a time (keys in tmm4 and tmm6, scores in tmm5 and tmm7): two chains in flight */
        for (; kb + 2 <= key_blocks; kb += 2) {
            const uint8_t *block = keys + kb * steps * TILE_BYTES;
            _tile_zero(5);
            _tile_zero(7);
            _tile_loadd(4, block, 64);
            _tile_loadd(6, block + steps * TILE_BYTES, 64);
            _tile_dpbf16ps(5, 0, 4);
            _tile_dpbf16ps(7, 0, 6);
            if (steps > 1) {
                _tile_loadd(4, block + TILE_BYTES, 64);
                _tile_loadd(6, block + 3 * TILE_BYTES, 64);
                _tile_dpbf16ps(5, 1, 4);
                _tile_dpbf16ps(7, 1, 6);
            }
            _tile_stored(5, scores + kb * 16, width * 4);
            _tile_stored(7, scores + kb * 16 + 16, width * 4);
        }
    for (; kb < key_blocks; kb++) {
        const uint8_t *block = keys + kb * steps * TILE_BYTES;
        _tile_zero(5);
        _tile_loadd(4, block, 64);
        _tile_dpbf16ps(5, 0, 4);
        if (steps > 1) {
            _tile_loadd(4, block + TILE_BYTES, 64);
            _tile_dpbf16ps(5, 1, 4);
        }
        if (steps > 2) {
            _tile_loadd(4, block + 2 * TILE_BYTES, 64);
            _tile_dpbf16ps(5, 2, 4);
        }
        if (steps > 3) {
            _tile_loadd(4, block + 3 * TILE_BYTES, 64);
            _tile_dpbf16ps(5, 3, 4);
        }
        _tile_stored(5, scores + kb * 16, width * 4);
    }

    const __m512 scale = _mm512_set1_ps(a->scale);
    for (int64_t m = 0; m < TILE_ROWS; m++) {
        const int64_t r = first + m;
        const float *row = scores + m * width;
        uint16_t *prob = probs + m * width;
        const int64_t n = r < a->rows ? keys_seen(a, r) : 0;
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 live = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            top = _mm512_mask_max_ps(top, live, top, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, row + j), scale));
        }
        const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < pair_blocks * 32; j += 16) {
            __m512 p = _mm512_setzero_ps();
            if (j < n) {
                const __mmask16 live = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
                __m512 x = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(live, row + j), scale, shift);
                p = _mm512_maskz_mov_ps(live, exp16(x));
                sum = _mm512_add_ps(sum, p);
            }
            _mm256_storeu_si256((__m256i *)(prob + j), (__m256i)_mm512_cvtneps_pbh(p));
        }
        sums[m] = n ? _mm512_reduce_add_ps(sum) : 1.0f;
    }

    const uint8_t *values = a->values + h * a->pair_blocks * 16 * d * 4;
    for (int64_t c0 = 0; c0 < d / 16; c0 += 4) {
        const int64_t tiles = d / 16 - c0 < 4 ? d / 16 - c0 : 4;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t pb = 0; pb < pair_blocks; pb++) {
            _tile_loadd(4, probs + pb * 32, width * 2);
            const uint8_t *block = values + (pb * 16 * d + c0 * 16) * 4;
            _tile_loadd(5, block, d * 4);
            _tile_dpbf16ps(0, 4, 5);
            if (tiles > 1) {
                _tile_loadd(5, block + 64, d * 4);
                _tile_dpbf16ps(1, 4, 5);
            }
            if (tiles > 2) {
                _tile_loadd(5, block + 128, d * 4);
                _tile_dpbf16ps(2, 4, 5);
            }
            if (tiles > 3) {
                _tile_loadd(5, block + 192, d * 4);
                _tile_dpbf16ps(3, 4, 5);
            }
        }
        _tile_stored(0, outputs + c0 * 16, d * 4);
        if (tiles > 1) _tile_stored(1, outputs + c0 * 16 + 16, d * 4);
        if (tiles > 2) _tile_stored(2, outputs + c0 * 16 + 32, d * 4);
        if (tiles > 3) _tile_stored(3, outputs + c0 * 16 + 48, d * 4);
    }
    for (int64_t r = first; r <= last; r++) {
        const int64_t m = r - first;
        float *to = a->out + (r % a->tokens) * a->out_stride + (h * a->group + r / a->tokens) * d;
        const __m512 inverse = _mm512_set1_ps(1.0f / sums[m]);
        for (int64_t e = 0; e < d; e += 16)
            _mm512_storeu_ps(to + e, _mm512_mul_ps(_mm512_loadu_ps(outputs + m * d + e), inverse));
    }
}

/* Every tile 16 rows of 64 bytes (palette 1; LDTILECFG's 64-byte operand). A constant in memory: GCC's
   _tile_loadconfig tells the compiler it reads 8 bytes, so a local's other fields could be dropped as dead stores. */
typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} tile_config;

static const tile_config TILES __attribute__((aligned(64))) = {
    .palette = 1,
    .bytes_per_row = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS},
};

AMX static void attend_part(void *data, int thread, int threads) {
    const chunk_args *a = (const chunk_args *)data;
    _tile_loadconfig(&TILES);
    const int64_t items = a->kv_heads * a->row_blocks;
    for (int64_t item = thread; item < items; item += threads)
        attend_rows(a, item / a->row_blocks, item % a->row_blocks, a->scratch + thread * a->scratch_bytes);
    _tile_release();
}

/* chunk_workspace(tokens, context, heads, kv_heads, head_dim, threads) -> bytes chunk_attention needs. */
PyObject *py_chunk_workspace(PyObject *self, PyObject *args) {
    (void)self;
    chunk_args a = {0};
    int threads;
    if (!PyArg_ParseTuple(args, "nnnnni", &a.tokens, &a.context, &a.heads, &a.kv_heads, &a.head_dim, &threads))
        return NULL;
    if (a.kv_heads < 1 || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "kv_heads and threads must be positive");
        return NULL;
    }
    return PyLong_FromLongLong(chunk_layout(&a, threads));
}

PyObject *py_chunk_attention(PyObject *self, PyObject *args) {
    (void)self;
    chunk_args a = {0};
    Py_ssize_t q, k, v, slots, out, num_slots, workspace, workspace_bytes;
    int threads;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnnnnnfnni", &q, &a.q_stride, &k, &v, &num_slots, &slots, &out,
                          &a.out_stride, &a.tokens, &a.context, &a.heads, &a.kv_heads, &a.head_dim, &a.scale,
                          &workspace, &workspace_bytes, &threads))
        return NULL;
    if (!amx_usable()) {
        PyErr_SetString(PyExc_RuntimeError, "AMX-BF16 is not usable on this CPU");
        return NULL;
    }
    if (a.tokens < 1 || a.context < a.tokens || a.kv_heads < 1 || a.heads % a.kv_heads ||
        a.head_dim % CHUNK_HEAD_DIM_STEP || a.head_dim > CHUNK_MAX_HEAD_DIM || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "chunk_attention takes 1 <= tokens <= context, heads a multiple of kv_heads "
                                          "and a head_dim that is a multiple of 32, at most 128");
        return NULL;
    }
    if (chunk_layout(&a, threads) > workspace_bytes) {
        PyErr_SetString(PyExc_ValueError, "the workspace is smaller than chunk_workspace says");
        return NULL;
    }
    if (!slots_in_pool((const int64_t *)slots, a.context, num_slots)) {
        PyErr_SetString(PyExc_IndexError, "a slot is outside the pool");
        return NULL;
    }
    a.q = (const float *)q;
    a.k = (const uint16_t *)k;
    a.v = (const uint16_t *)v;
    a.slots = (const int64_t *)slots;
    a.out = (float *)out;
    a.keys = (uint8_t *)workspace;
    a.values = a.keys + a.keys_bytes;
    a.queries = a.values + a.values_bytes;
    a.scratch = a.queries + a.queries_bytes;
    count_path(PATH_AMX_CHUNK_ATTENTION);
    Py_BEGIN_ALLOW_THREADS
    run_parallel(pack_part, &a, threads);
    run_parallel(attend_part, &a, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
#endif
