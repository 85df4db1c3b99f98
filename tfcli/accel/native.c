/* tfcli's C code for decoding on the CPU, built by tfcli/accel/native.py with -O3 -march=native -fopenmp
 * (or without -fopenmp where the compiler has no OpenMP: then one thread does all the rows).
 *
 * At batch 1 a decoding step multiplies one row by every weight, so its cost is reading the weights once
 * from memory, plus, for a small model, the fixed cost of each of the step's hundred-odd PyTorch calls.
 * - vector_linear: y = W x + b for one row. Each weight row is streamed front to back against x, which
 *   stays in the L1 cache, into four independent vector accumulators; the rows are split between OpenMP
 *   threads. The `lanes` type becomes whatever vectors the processor has (AVX-512, AVX2, NEON).
 * - quant_parallel: y = x W^T for W's rows of llama.cpp blocks, by the product of blocks.c that tfcli.accel.quant
 *   chose for W (a function pointer): the rows split between OpenMP threads as vector_linear splits them.
 * - decoder_step: one token through a whole decoder (transformer.py's Transformer.decode and lm_head, for
 *   one unpadded row with a KV cache) in one call, the same arithmetic in the same order of operations. Each
 *   weight matrix is fp32 or block-quantized (a `matrix`); the token embedding's row of a quantized embedding
 *   is dequantized by blocks.c's quant_dequantize, the same values QuantEmbedding looks up.
 * When tfcli is loaded the OpenMP runtime is PyTorch's own, so these threads are its threads.
 * The structs decoder_layer and decoder come from layout.h, which native.py writes from layout.py, the one
 * description of their fields that the Python side uses too.
 */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "layout.h"
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* One vector register's worth of floats: whatever the compiler targets with -march=native. A vector
 * wider than the machine's registers is split into scalar code by the compiler, several times slower. */
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float lanes __attribute__((vector_size(LANES * sizeof(float)), aligned(sizeof(float))));

static float total(lanes v) {
    float sum = 0.0f;
    for (int i = 0; i < LANES; i++) sum += v[i];
    return sum;
}

static float row_dot(const float *row, const float *x, long k) {
    lanes a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    long j = 0;
    for (; j + 4 * LANES <= k; j += 4 * LANES) {
        a0 += *(const lanes *)(row + j) * *(const lanes *)(x + j);
        a1 += *(const lanes *)(row + j + LANES) * *(const lanes *)(x + j + LANES);
        a2 += *(const lanes *)(row + j + 2 * LANES) * *(const lanes *)(x + j + 2 * LANES);
        a3 += *(const lanes *)(row + j + 3 * LANES) * *(const lanes *)(x + j + 3 * LANES);
    }
    for (; j + LANES <= k; j += LANES) a0 += *(const lanes *)(row + j) * *(const lanes *)(x + j);
    float sum = total((a0 + a1) + (a2 + a3));
    for (; j < k; j++) sum += row[j] * x[j];
    return sum;
}

/* Inside a parallel region: this thread's rows [first, last) of n, shares rounded up to a multiple of `align`.
 * Returns the number of threads. */
static long this_threads_share(long n, long align, long *first, long *last) {
#ifdef _OPENMP
    const long count = omp_get_num_threads(), index = omp_get_thread_num();
#else
    const long count = 1, index = 0;
#endif
    const long share = ((n + count - 1) / count + align - 1) / align * align;
    *first = index * share;
    *last = *first + share < n ? *first + share : n;
    return count;
}

/* w: (n, k) row-major, x: (k,), bias: (n,) or NULL, y: (n,). Uses `threads` threads once the weight has
 * at least `parallel_from` elements (below that, starting them costs more than they save). */
void vector_linear(const float *w, const float *x, const float *bias, float *y, long n, long k, int threads, long parallel_from) {
    #pragma omp parallel num_threads(threads) if (n * k >= parallel_from)
    {
        long first, last;
        this_threads_share(n, 1, &first, &last);
        for (long i = first; i < last; i++) {
            float value = row_dot(w + i * k, x, k);
            y[i] = bias ? value + bias[i] : value;
        }
    }
}

/* y (m, n) = x (m, k) W^T for W's n rows of blocks (`format`, `row_bytes` each) by blocks.c's `product`, the rows
 * split between `threads` threads once W has at least `parallel_from` elements. Each thread multiplies its share
 * of W's rows with every input row (a product that rounds the activations rounds them in each thread, the same
 * way: a few microseconds against the rows' milliseconds). Returns 0, or the product's nonzero status (-2: no
 * memory). */
int quant_parallel(quant_product product, int format, const void *w, long row_bytes, const float *x, float *y, long m, long n, long k, int threads, long parallel_from) {
    int status = 0;
    #pragma omp parallel num_threads(threads) if (n * k >= parallel_from) reduction(| : status)
    {
        long first, last;
        const long count = this_threads_share(n, 16, &first, &last); /* whole cache lines of y to each thread */
        const unsigned char *rows = (const unsigned char *)w + first * row_bytes;
        if (first < last && (count == 1 || m == 1)) { /* one input row: this thread's outputs are contiguous in y */
            status |= product(format, rows, x, y + first, m, last - first, k);
        } else if (first < last) { /* several: the product writes (m, last - first), which goes into y's columns first..last */
            float *part = malloc(sizeof(float) * (size_t)m * (size_t)(last - first));
            if (!part) {
                status |= -2;
            } else {
                status |= product(format, rows, x, part, m, last - first, k);
                for (long i = 0; i < m; i++) memcpy(y + i * n + first, part + i * (last - first), sizeof(float) * (size_t)(last - first));
                free(part);
            }
        }
    }
    return status;
}

/* ---- one decoding step ------------------------------------------------------------------------------ */

/* y = W x + bias for one row, W fp32 or blocks. Returns 0, or a product's nonzero status (no memory). */
static int linear(const matrix *w, const float *x, const float *bias, float *y, long n, long k, int threads, long parallel_from) {
    if (w->format == FORMAT_FP32) {
        vector_linear((const float *)w->data, x, bias, y, n, k, threads, parallel_from);
        return 0;
    }
    int status = quant_parallel(w->product, w->format, w->data, w->row_bytes, x, y, 1, n, k, threads, parallel_from);
    if (bias)
        for (long i = 0; i < n; i++) y[i] += bias[i];
    return status;
}

/* Floats of scratch memory decoder_step needs. */
long decoder_workspace(const decoder *m) {
    long kv_width = m->n_kv_heads * m->head_dim;
    long up = m->activation == ACTIVATION_SWIGLU ? 2 * m->hidden : m->hidden;
    return 3 * m->d_model + (m->d_model + 2 * kv_width) + up + m->capacity;
}

/* Sums in double: a residual stream far from zero loses no more precision here than in PyTorch's norms. */
static void norm(const decoder *m, const float *weight, const float *bias, const float *x, float *y) {
    long d = m->d_model;
    double mean = 0.0, square = 0.0;
    if (m->norm == NORM_LAYER) {
        for (long i = 0; i < d; i++) mean += x[i];
        mean /= d;
        for (long i = 0; i < d; i++) square += (x[i] - mean) * (x[i] - mean);
    } else {
        for (long i = 0; i < d; i++) square += (double)x[i] * x[i];
    }
    float scale = (float)(1.0 / sqrt(square / d + m->norm_eps));
    for (long i = 0; i < d; i++) y[i] = (float)(x[i] - mean) * scale * weight[i] + (bias ? bias[i] : 0.0f);
}

/* RoPE on one head's vector: each (i, i + hs/2) pair turned by the angle of `position`. */
static void rotate(const decoder *m, float *x, long position) {
    long half = m->head_dim / 2;
    const float *cos = m->rotary_cos + position * m->head_dim, *sin = m->rotary_sin + position * m->head_dim;
    for (long i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* Softmax attention of one query per head over keys 0..last of the cache (all of them: the new token
 * comes after every cached one). Query head h reads key/value head h / (n_heads / n_kv_heads). */
static void attend(const decoder *m, const decoder_layer *layer, const float *q, long last, float *scores, float *y) {
    long hs = m->head_dim, group = m->n_heads / m->n_kv_heads;
    float scale = 1.0f / sqrtf((float)hs);
    for (long h = 0; h < m->n_heads; h++) {
        const float *keys = layer->keys + (h / group) * m->capacity * hs;
        const float *values = layer->values + (h / group) * m->capacity * hs;
        float top = -INFINITY, sum = 0.0f;
        for (long j = 0; j <= last; j++) {
            scores[j] = row_dot(keys + j * hs, q + h * hs, hs) * scale;
            top = scores[j] > top ? scores[j] : top;
        }
        for (long j = 0; j <= last; j++) {
            scores[j] = expf(scores[j] - top);
            sum += scores[j];
        }
        float *out = y + h * hs;
        for (long i = 0; i < hs; i++) out[i] = 0.0f;
        for (long j = 0; j <= last; j++) {
            float p = scores[j] / sum;
            const float *v = values + j * hs;
            for (long i = 0; i < hs; i++) out[i] += p * v[i];
        }
    }
}

static void activate(const decoder *m, float *h) {
    long n = m->hidden;
    switch (m->activation) {
    case ACTIVATION_SWIGLU:  /* silu(gate) * up */
        for (long i = 0; i < n; i++) h[i] = h[i] / (1.0f + expf(-h[i])) * h[n + i];
        break;
    case ACTIVATION_RELU:
        for (long i = 0; i < n; i++) h[i] = h[i] > 0.0f ? h[i] : 0.0f;
        break;
    case ACTIVATION_GELU_TANH:
        for (long i = 0; i < n; i++) {
            float x = h[i];
            h[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
        }
        break;
    default:
        for (long i = 0; i < n; i++) h[i] = 0.5f * h[i] * (1.0f + erff(h[i] * 0.7071067811865476f));
    }
}

/* A sublayer's output y joins the residual stream x: pre-norm x + y, post-norm norm(x + y). */
static void residual(const decoder *m, float *x, const float *y, const float *weight, const float *bias, float *scratch) {
    for (long i = 0; i < m->d_model; i++) x[i] += y[i];
    if (!m->pre_norm) {
        norm(m, weight, bias, x, scratch);
        for (long i = 0; i < m->d_model; i++) x[i] = scratch[i];
    }
}

/* Token `token` at `position`, after `position` cached tokens: writes its keys and values into the cache
 * at that position and the next-token scores into logits (vocab,). The caller checks every shape and
 * that position < capacity; workspace holds decoder_workspace(m) floats. Returns 0, or the nonzero status of
 * a block product or dequantizer that failed (no memory): then the logits are not to be used. */
int decoder_step(const decoder *m, long token, long position, float *logits, float *workspace, int threads, long parallel_from) {
    long d = m->d_model, hs = m->head_dim, kv_width = m->n_kv_heads * hs;
    float *x = workspace, *h = x + d, *y = h + d, *qkv = y + d, *up = qkv + d + 2 * kv_width;
    float *scores = up + (m->activation == ACTIVATION_SWIGLU ? 2 * m->hidden : m->hidden);
    int status = 0;
    const matrix *embedding = &m->token_embedding;
    if (embedding->format == FORMAT_FP32) {
        for (long i = 0; i < d; i++) x[i] = ((const float *)embedding->data)[token * d + i];
    } else {
        status |= embedding->expand(embedding->format, (const unsigned char *)embedding->data + token * embedding->row_bytes, x, 1, d);
    }
    if (m->position_table)
        for (long i = 0; i < d; i++) x[i] += m->position_table[position * d + i];
    for (long l = 0; l < m->n_layers; l++) {
        const decoder_layer *layer = m->layers + l;
        /* attention */
        if (m->pre_norm) norm(m, layer->attn_norm_weight, layer->attn_norm_bias, x, h);
        status |= linear(&layer->qkv_weight, m->pre_norm ? h : x, layer->qkv_bias, qkv, d + 2 * kv_width, d, threads, parallel_from);
        float *q = qkv, *k = qkv + d, *v = qkv + d + kv_width;
        if (m->rotary_cos) {
            for (long head = 0; head < m->n_heads; head++) rotate(m, q + head * hs, position);
            for (long head = 0; head < m->n_kv_heads; head++) rotate(m, k + head * hs, position);
        }
        for (long head = 0; head < m->n_kv_heads; head++) {
            float *key_slot = layer->keys + (head * m->capacity + position) * hs;
            float *value_slot = layer->values + (head * m->capacity + position) * hs;
            for (long i = 0; i < hs; i++) {
                key_slot[i] = k[head * hs + i];
                value_slot[i] = v[head * hs + i];
            }
        }
        attend(m, layer, q, position, scores, h);
        status |= linear(&layer->out_weight, h, layer->out_bias, y, d, d, threads, parallel_from);
        residual(m, x, y, layer->attn_norm_weight, layer->attn_norm_bias, h);
        /* MLP */
        if (m->pre_norm) norm(m, layer->mlp_norm_weight, layer->mlp_norm_bias, x, h);
        long width = m->activation == ACTIVATION_SWIGLU ? 2 * m->hidden : m->hidden;
        status |= linear(&layer->fc_weight, m->pre_norm ? h : x, layer->fc_bias, up, width, d, threads, parallel_from);
        activate(m, up);
        status |= linear(&layer->proj_weight, up, layer->proj_bias, y, d, m->hidden, threads, parallel_from);
        residual(m, x, y, layer->mlp_norm_weight, layer->mlp_norm_bias, h);
    }
    if (m->final_norm_weight) {
        norm(m, m->final_norm_weight, m->final_norm_bias, x, h);
        x = h;
    }
    status |= linear(&m->head_weight, x, NULL, logits, m->vocab, d, threads, parallel_from);
    return status;
}
