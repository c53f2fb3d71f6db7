/* A decode step through every decoder layer of a Llama-architecture model in one call
   (local_engine.model.cpu_kernels.decode_layers): the same kernels the per-operation entries run, in the order
   local_engine.model.fused_llama runs them, without a return to Python between them. */
#include "attention.h"

/* Per layer, the addresses of its tensors (one int64 row of the `layers` table, in this order). */
enum { INPUT_NORM, POST_NORM, QKV, O_PROJ, GATE_UP, DOWN, LAYER_FIELDS };

typedef struct {
    int64_t rows, hidden, heads, kv_heads, head_dim, intermediate;
} decoder_shape;

/* The step's scratch rows, allocated once for every layer. */
typedef struct {
    float *normed, *qkv, *attended, *gate_up, *activated;
} decoder_scratch;

static int allocate_scratch(decoder_scratch *s, const decoder_shape *d) {
    const int64_t qkv = (d->heads + 2 * d->kv_heads) * d->head_dim;
    const int64_t total = d->rows * (d->hidden + qkv + d->heads * d->head_dim + 3 * d->intermediate);
    float *block = malloc(sizeof(float) * (size_t)total);
    if (block == NULL) return -1;
    s->normed = block;
    s->qkv = s->normed + d->rows * d->hidden;
    s->attended = s->qkv + d->rows * qkv;
    s->gate_up = s->attended + d->rows * d->heads * d->head_dim;
    s->activated = s->gate_up + d->rows * 2 * d->intermediate;
    return 0;
}

PyObject *py_decode_layers(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t hidden_states, layers, num_layers, pool_k, pool_v, layer_stride, num_slots, cos, sin, write_slots,
        slots, segments, seg_rows, num_seg_rows, stride, num_segments;
    decoder_shape d;
    float eps, scale;
    int weights_bf16, pool_bf16, threads;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnnnnnnnnnnnnnnffppi", &hidden_states, &layers, &num_layers, &pool_k, &pool_v,
                          &layer_stride, &num_slots, &cos, &sin, &write_slots, &slots, &segments, &seg_rows,
                          &num_seg_rows, &stride, &num_segments, &d.rows, &d.hidden, &d.heads, &d.kv_heads,
                          &d.head_dim, &d.intermediate, &eps, &scale, &weights_bf16, &pool_bf16, &threads))
        return NULL;
    if (!attention_shape_supported(d.heads, d.kv_heads, d.head_dim)) {
        PyErr_SetString(PyExc_ValueError, "unsupported attention shape");
        return NULL;
    }
    if (!slots_in_pool((const int64_t *)write_slots, d.rows, num_slots)) {
        PyErr_SetString(PyExc_IndexError, "slot out of the pool");
        return NULL;
    }
    if (!plan_valid((const int64_t *)slots, d.rows, stride, (const int64_t *)segments, num_segments,
                    (const int64_t *)seg_rows, num_seg_rows, num_slots)) {
        PyErr_SetString(PyExc_IndexError, "the decode plan reads outside its rows, its slot tables or the pool");
        return NULL;
    }
    decoder_scratch s;
    if (allocate_scratch(&s, &d) != 0) return PyErr_NoMemory();
    /* One plan for every layer: the attention's records are reserved once, so nothing after this can fail. */
    attention_args a = {s.qkv, NULL, NULL, (const int64_t *)slots, (const int64_t *)segments, (const int64_t *)seg_rows,
                        NULL, NULL, (d.heads + 2 * d.kv_heads) * d.head_dim, stride, num_segments, d.heads,
                        d.kv_heads, d.head_dim, scale, pool_bf16, 0};
    if (attention_reserve(&a, d.rows) != 0) {
        free(s.normed);
        return PyErr_NoMemory();
    }
    const int64_t qkv_width = (d.heads + 2 * d.kv_heads) * d.head_dim, kv_width = d.kv_heads * d.head_dim;
    const int64_t attended_width = d.heads * d.head_dim;
    float *hidden = (float *)hidden_states;
    count_path(PATH_DECODE_LAYERS);
    Py_BEGIN_ALLOW_THREADS
    for (int64_t layer = 0; layer < num_layers; layer++) {
        const int64_t *at = (const int64_t *)layers + layer * LAYER_FIELDS;
        void *layer_k = (char *)pool_k + layer * layer_stride * (pool_bf16 ? 2 : 4);
        void *layer_v = (char *)pool_v + layer * layer_stride * (pool_bf16 ? 2 : 4);
        /* Attention: RMSNorm, q, k and v in one matmul, rotary on q and k, the new K/V into the pool, then the
           rows attend their contexts (queries read in place from the qkv rows) and o_proj adds to the residual. */
        rms_norm(hidden, (const void *)at[INPUT_NORM], s.normed, d.rows, d.hidden, eps, weights_bf16);
        linear_run(s.normed, (const void *)at[QKV], s.qkv, d.rows, qkv_width, d.hidden, weights_bf16, 0, threads);
        rotate_rows(s.qkv, (const float *)cos, (const float *)sin, d.rows, qkv_width, d.heads + d.kv_heads,
                    d.head_dim);
        store_rows(layer_k, s.qkv + attended_width, qkv_width, (const int64_t *)write_slots, d.rows, kv_width,
                   pool_bf16);
        store_rows(layer_v, s.qkv + attended_width + kv_width, qkv_width, (const int64_t *)write_slots, d.rows,
                   kv_width, pool_bf16);
        a.k = layer_k;
        a.v = layer_v;
        attend_decode(&a, s.attended, d.rows, threads);
        linear_run(s.attended, (const void *)at[O_PROJ], hidden, d.rows, d.hidden, attended_width, weights_bf16, 1,
                   threads);
        /* MLP: RMSNorm, gate and up in one matmul, silu(gate) * up, down_proj added to the residual. */
        rms_norm(hidden, (const void *)at[POST_NORM], s.normed, d.rows, d.hidden, eps, weights_bf16);
        linear_run(s.normed, (const void *)at[GATE_UP], s.gate_up, d.rows, 2 * d.intermediate, d.hidden,
                   weights_bf16, 0, threads);
        silu_mul_rows(s.gate_up, s.activated, d.rows, d.intermediate);
        linear_run(s.activated, (const void *)at[DOWN], hidden, d.rows, d.hidden, d.intermediate, weights_bf16, 1,
                   threads);
    }
    Py_END_ALLOW_THREADS
    attention_release(&a);
    free(s.normed);
    Py_RETURN_NONE;
}
