/* A step's new K/V into the pool, and a decoder layer's elementwise steps. */
#include "cpu_kernels.h"

/* ---------------------------------------------------------------------------------------------------------------
 * A step's new K (or V) into the pool: row r of src (`width` floats, rows `src_stride` floats apart) into slot
 * slots[r] (each checked against num_slots) of a pool of `width`-element slots, float32 or bfloat16. bfloat16 is
 * rounded by to_bf16, so the pool holds what torch's `.to(torch.bfloat16)` would write.
 * ------------------------------------------------------------------------------------------------------------- */
int slots_in_pool(const int64_t *slots, int64_t rows, int64_t num_slots) {
    for (int64_t r = 0; r < rows; r++)
        if (slots[r] < 0 || slots[r] >= num_slots) return 0;
    return 1;
}

void store_rows(void *pool, const float *src, int64_t src_stride, const int64_t *slots, int64_t rows,
                int64_t width, int bf16) {
    for (int64_t r = 0; r < rows; r++) {
        const float *from = src + r * src_stride;
        if (bf16) {
            uint16_t *to = (uint16_t *)pool + slots[r] * width;
            for (int64_t i = 0; i < width; i++) to[i] = to_bf16(from[i]);
        } else {
            memcpy((float *)pool + slots[r] * width, from, sizeof(float) * (size_t)width);
        }
    }
}

PyObject *py_store_rows(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t pool, num_slots, src, src_stride, slots, rows, width;
    int bf16;
    if (!PyArg_ParseTuple(args, "nnnnnnnp", &pool, &num_slots, &src, &src_stride, &slots, &rows, &width, &bf16))
        return NULL;
    if (!slots_in_pool((const int64_t *)slots, rows, num_slots)) {
        PyErr_SetString(PyExc_IndexError, "slot out of the pool");
        return NULL;
    }
    store_rows((void *)pool, (const float *)src, src_stride, (const int64_t *)slots, rows, width, bf16);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------------------------
 * The elementwise steps of a Llama decoder layer, each one pass over a step's few rows on the calling thread
 * (torch spends more on dispatching them than on the arithmetic): RMSNorm (Zhang and Sennrich, 2019, as
 * transformers' LlamaRMSNorm computes it: x * rsqrt(mean(x^2) + eps), then times the weight), the rotary embedding
 * (Su et al., "RoFormer", 2021, in the rotate_half form: x * cos + rotate_half(x) * sin) and SwiGLU's
 * silu(gate) * up (Shazeer, "GLU Variants Improve Transformer", 2020).
 * ------------------------------------------------------------------------------------------------------------- */
AVX2_INLINE void rms_norm_rows(const float *x, const void *w, float *y, int64_t rows, int64_t n, float eps,
                               const int bf16) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t r = 0; r < rows; r++) {
        const float *in = x + r * n;
        float *out = y + r * n;
        __m256 squares = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i < n8; i += 8) {
            const __m256 v = _mm256_loadu_ps(in + i);
            squares = _mm256_fmadd_ps(v, v, squares);
        }
        float total = sum8(squares);
        for (; i < n; i++) total += in[i] * in[i];
        const float inverse = 1.0f / sqrtf(total / (float)n + eps);
        const __m256 scale = _mm256_set1_ps(inverse);
        for (i = 0; i < n8; i += 8)
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(in + i), scale),
                                                    load8(w, i, bf16)));
        for (; i < n; i++) out[i] = in[i] * inverse * load1(w, i, bf16);
    }
}

AVX2 void rms_norm(const float *x, const void *w, float *y, int64_t rows, int64_t n, float eps, int bf16) {
    if (bf16) rms_norm_rows(x, w, y, rows, n, eps, 1);
    else rms_norm_rows(x, w, y, rows, n, eps, 0);
}

PyObject *py_rms_norm(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t x, w, y, rows, n;
    float eps;
    int bf16;
    if (!PyArg_ParseTuple(args, "nnnnnfp", &x, &w, &y, &rows, &n, &eps, &bf16)) return NULL;
    rms_norm((const float *)x, (const void *)w, (float *)y, rows, n, eps, bf16);
    Py_RETURN_NONE;
}

/* In place on heads [0, heads) of each row of x (rows `stride` floats apart, heads head_dim apart); cos and sin
   [rows, head_dim]. */
AVX2 void rotate_rows(float *x, const float *cos, const float *sin, int64_t rows, int64_t stride, int64_t heads,
                      int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + r * head_dim, *s = sin + r * head_dim;
        for (int64_t h = 0; h < heads; h++) {
            float *first = x + r * stride + h * head_dim, *second = first + half;
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {
                const __m256 a = _mm256_loadu_ps(first + i), b = _mm256_loadu_ps(second + i);
                _mm256_storeu_ps(first + i, _mm256_fnmadd_ps(b, _mm256_loadu_ps(s + i),
                                                             _mm256_mul_ps(a, _mm256_loadu_ps(c + i))));
                _mm256_storeu_ps(second + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(s + half + i),
                                                             _mm256_mul_ps(b, _mm256_loadu_ps(c + half + i))));
            }
            for (; i < half; i++) {
                const float a = first[i], b = second[i];
                first[i] = a * c[i] - b * s[i];
                second[i] = b * c[half + i] + a * s[half + i];
            }
        }
    }
}

PyObject *py_rotate(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t x, cos, sin, rows, stride, heads, head_dim;
    if (!PyArg_ParseTuple(args, "nnnnnnn", &x, &cos, &sin, &rows, &stride, &heads, &head_dim)) return NULL;
    rotate_rows((float *)x, (const float *)cos, (const float *)sin, rows, stride, heads, head_dim);
    Py_RETURN_NONE;
}

/* out [rows, n] = silu(gate_up[:, :n]) * gate_up[:, n:], gate_up [rows, 2n]. */
AVX2 void silu_mul_rows(const float *gate_up, float *out, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * n, *up = gate + n;
        float *o = out + r * n;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256 g = _mm256_loadu_ps(gate + i);
            const __m256 e = exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(88.0f)));
            const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
        }
        for (; i < n; i++) o[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

PyObject *py_silu_mul(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t gate_up, out, rows, n;
    if (!PyArg_ParseTuple(args, "nnnn", &gate_up, &out, &rows, &n)) return NULL;
    silu_mul_rows((const float *)gate_up, (float *)out, rows, n);
    Py_RETURN_NONE;
}

