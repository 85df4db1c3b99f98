/* Products with block-quantized weights: y (m, n) = x (m, k) W^T, W's n rows held as llama.cpp's blocks (q8_0,
 * q4_0, q4_K, q6_K) or bf16, x and y fp32. For decoding: one row (m = 1) or a few (a served batch).
 *
 * One source, built once per path (tfcli/accel/quant.py): `portable` (plain C for the baseline of the machine's
 * architecture), `avx2` (-mavx2 -mfma -mf16c) and `avx512` (-mavx512f -mavx512bw -mavx512vl ...); the vector
 * code below is chosen by the compiler's own macros (__AVX2__, __AVX512F__). Each weight block is expanded to
 * fp32 in a small buffer (as ggml's dequantize_row_* does: the same values, bit for bit) and multiplied into
 * every input row while it is in the cache, with fp32 sums: the result is dequantize-then-matmul's up to the
 * order of the sums. Two more builds round the activations as llama.cpp does (quant_linear_int8, at the end):
 * `avx512_vnni` (-mavx512vnni: int8 activations for the integer formats) and `avx512_bf16` (-mavx512bf16 too:
 * bf16 activations for bf16 weights).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { F_Q8_0 = 0, F_Q4_0 = 1, F_Q4_K = 2, F_Q6_K = 3, F_BF16 = 4 };
#define ROWS 8  /* input rows multiplied together (a larger m goes in groups of ROWS) */
#define QK_K 256

static inline float fp16_to_fp32(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exponent = 127 - 15 + 1;
            while (!(mantissa & 0x400)) { mantissa <<= 1; exponent--; }
            bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
        }
    } else if (exponent == 31) {
        bits = sign | 0x7F800000 | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* --- each block to fp32 (ggml's dequantize_row_*): the portable and AVX2 products, and quant_dequantize -- */

static void expand_q8_0(const uint8_t *b, float *out) {
    const float d = fp16_to_fp32(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int i = 0; i < 32; i++) out[i] = d * (float)q[i];
}

static void expand_q4_0(const uint8_t *b, float *out) {
    const float d = fp16_to_fp32(b);
    const uint8_t *q = b + 2;
    for (int i = 0; i < 16; i++) {
        out[i] = d * (float)((q[i] & 0x0F) - 8);
        out[i + 16] = d * (float)((q[i] >> 4) - 8);
    }
}

static void expand_q4_K(const uint8_t *b, float *out) {
    const float d = fp16_to_fp32(b), dmin = fp16_to_fp32(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0; j < 8; j += 2) {
        uint8_t sc, m;
        scale_min_k4(j, scales, &sc, &m);
        const float d1 = d * sc, m1 = dmin * m;
        scale_min_k4(j + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; l++) {
            out[l] = d1 * (float)(q[l] & 0xF) - m1;
            out[l + 32] = d2 * (float)(q[l] >> 4) - m2;
        }
        out += 64;
        q += 32;
    }
}

static void expand_q6_K(const uint8_t *b, float *out) {
    const float d = fp16_to_fp32(b + 208);
    for (int half = 0; half < 2; half++) {
        const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * half;
        for (int quarter = 0; quarter < 4; quarter++) { /* values 32 * quarter + l of this half */
            const uint8_t *low = ql + (quarter & 1) * 32;
            const int low_shift = (quarter >> 1) * 4, high_shift = 2 * quarter;
            for (int part = 0; part < 2; part++) { /* 16 values that share a scale */
                const float scale = d * sc[part + 2 * quarter];
                for (int l = 16 * part; l < 16 * part + 16; l++) {
                    const int q = (int)(((low[l] >> low_shift) & 0xF) | (((qh[l] >> high_shift) & 3) << 4)) - 32;
                    out[128 * half + 32 * quarter + l] = scale * (float)q;
                }
            }
        }
    }
}

static void expand_bf16(const uint8_t *b, float *out) { /* a "block" of 32 values */
    for (int i = 0; i < 32; i++) {
        uint32_t bits = (uint32_t)(b[2 * i] | (b[2 * i + 1] << 8)) << 16;
        memcpy(out + i, &bits, sizeof(float));
    }
}

typedef void (*expand_fn)(const uint8_t *, float *);

/* --- the block times each input row, summed into that row's accumulator ---------------------------------- */

#if defined(__AVX512F__)
typedef __m512 acc_t;
#define LANES 16
static inline acc_t acc_zero(void) { return _mm512_setzero_ps(); }
static inline acc_t acc_fma(const float *a, const float *b, acc_t acc) { return _mm512_fmadd_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b), acc); }
static inline float acc_sum(acc_t acc) { return _mm512_reduce_add_ps(acc); }
#elif defined(__AVX2__)
typedef __m256 acc_t;
#define LANES 8
static inline acc_t acc_zero(void) { return _mm256_setzero_ps(); }
static inline acc_t acc_fma(const float *a, const float *b, acc_t acc) { return _mm256_fmadd_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b), acc); }
static inline float acc_sum(acc_t acc) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#else
typedef struct { float v[8]; } acc_t;
#define LANES 8
static inline acc_t acc_zero(void) { acc_t a; memset(&a, 0, sizeof a); return a; }
static inline acc_t acc_fma(const float *a, const float *b, acc_t acc) {
    for (int i = 0; i < 8; i++) acc.v[i] += a[i] * b[i];
    return acc;
}
static inline float acc_sum(acc_t acc) {
    float s = 0;
    for (int i = 0; i < 8; i++) s += acc.v[i];
    return s;
}
#endif

#if !defined(__AVX512F__)
/* y[i * n + r] for rows i < m of x, weight rows r0 <= r < r1 */
static void rows_times_blocks(expand_fn expand, int block, int type_size, const uint8_t *w, const float *x, float *y, long m, long n, long k, long r0, long r1) {
    float values[QK_K] __attribute__((aligned(64)));
    const long blocks = k / block, row_bytes = blocks * type_size;
    for (long i0 = 0; i0 < m; i0 += ROWS) {
        const int rows = (int)(m - i0 < ROWS ? m - i0 : ROWS);
        for (long r = r0; r < r1; r++) {
            const uint8_t *row = w + r * row_bytes;
            acc_t acc[ROWS][4]; /* 4 chains of sums a row, so that each add need not wait for the one before */
            for (int i = 0; i < rows; i++)
                for (int c = 0; c < 4; c++) acc[i][c] = acc_zero();
            for (long b = 0; b < blocks; b++) {
                expand(row + b * type_size, values);
                const float *xb = x + i0 * k + b * block;
                for (int i = 0; i < rows; i++)
                    for (int j = 0; j < block; j += 4 * LANES)
                        for (int c = 0; c < 4; c++) acc[i][c] = acc_fma(values + j + c * LANES, xb + i * k + j + c * LANES, acc[i][c]);
            }
            for (int i = 0; i < rows; i++) y[(i0 + i) * n + r] = acc_sum(acc[i][0]) + acc_sum(acc[i][1]) + acc_sum(acc[i][2]) + acc_sum(acc[i][3]);
        }
    }
}
#endif

#if defined(__AVX512F__)
/* AVX-512: each block is expanded in registers, 16 values a vector, already scaled, and multiplied into every
 * input row's accumulator (the same fp32 values ggml's dequantize_row_* gives, summed in another order). */

static inline __m512 bytes_u8(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))); }

static inline __m512 nibbles(__m128i bytes, int high) {
    __m512i q = _mm512_cvtepu8_epi32(bytes);
    q = high ? _mm512_srli_epi32(q, 4) : _mm512_and_si512(q, _mm512_set1_epi32(0xF));
    return _mm512_cvtepi32_ps(q);
}

/* acc holds 4 accumulators for one input row (4 chains of FMAs run at once), else one per row */
#define ACC(i, offset) acc[rows == 1 ? (((offset) >> 4) & 3) : (i)]
#define MULTIPLY(v, offset)                                                                        \
    for (int i = 0; i < rows; i++) ACC(i, offset) = _mm512_fmadd_ps((v), _mm512_loadu_ps(x + i * k + (offset)), ACC(i, offset));
#define KERNEL static inline __attribute__((always_inline)) void

KERNEL rows_q8_0(const uint8_t *row, const float *x, long k, const int rows, __m512 *acc) {
    for (long b = 0; b < k / 32; b++, row += 34) {
        const __m512 d = _mm512_set1_ps(fp16_to_fp32(row));
        for (int h = 0; h < 2; h++) {
            const __m512 v = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + 2 + 16 * h)))));
            MULTIPLY(v, 32 * b + 16 * h)
        }
    }
}

KERNEL rows_q4_0(const uint8_t *row, const float *x, long k, const int rows, __m512 *acc) {
    const __m512 eight = _mm512_set1_ps(8.0f);
    for (long b = 0; b < k / 32; b++, row += 18) {
        const __m512 d = _mm512_set1_ps(fp16_to_fp32(row));
        const __m128i bytes = _mm_loadu_si128((const __m128i *)(row + 2));
        for (int h = 0; h < 2; h++) {
            const __m512 v = _mm512_mul_ps(d, _mm512_sub_ps(nibbles(bytes, h), eight));
            MULTIPLY(v, 32 * b + 16 * h)
        }
    }
}

KERNEL rows_q4_K(const uint8_t *row, const float *x, long k, const int rows, __m512 *acc) {
    for (long b = 0; b < k / QK_K; b++, row += 144) {
        const float d = fp16_to_fp32(row), dmin = fp16_to_fp32(row + 2);
        const uint8_t *scales = row + 4, *q = row + 16;
        for (int j = 0; j < 8; j += 2, q += 32) {
            uint8_t sc, m;
            for (int h = 0; h < 2; h++) { /* sub-block j + h: the low (h = 0) or high nibbles of these 32 bytes */
                scale_min_k4(j + h, scales, &sc, &m);
                const __m512 scale = _mm512_set1_ps(d * sc), minimum = _mm512_set1_ps(dmin * m);
                for (int part = 0; part < 2; part++) {
                    const __m512 v = _mm512_fmsub_ps(scale, nibbles(_mm_loadu_si128((const __m128i *)(q + 16 * part)), h), minimum);
                    MULTIPLY(v, QK_K * b + 32 * (j + h) + 16 * part)
                }
            }
        }
    }
}

KERNEL rows_q6_K(const uint8_t *row, const float *x, long k, const int rows, __m512 *acc) {
    const __m512i low4 = _mm512_set1_epi32(0xF), low2 = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
    for (long b = 0; b < k / QK_K; b++, row += 210) {
        const float d = fp16_to_fp32(row + 208);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = row + 64 * half, *qh = row + 128 + 32 * half;
            const int8_t *sc = (const int8_t *)(row + 192) + 8 * half;
            for (int quarter = 0; quarter < 4; quarter++) {
                const uint8_t *low = ql + (quarter & 1) * 32;
                for (int part = 0; part < 2; part++) {
                    __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(low + 16 * part)));
                    __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qh + 16 * part)));
                    lo = _mm512_and_si512(_mm512_srli_epi32(lo, (quarter >> 1) * 4), low4);
                    hi = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 2 * quarter), low2), 4);
                    const __m512 q = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(lo, hi), bias));
                    const __m512 v = _mm512_mul_ps(_mm512_set1_ps(d * sc[part + 2 * quarter]), q);
                    MULTIPLY(v, QK_K * b + 128 * half + 32 * quarter + 16 * part)
                }
            }
        }
    }
}

KERNEL rows_bf16(const uint8_t *row, const float *x, long k, const int rows, __m512 *acc) {
    for (long j = 0; j < k; j += 16) {
        const __m512i bits = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * j))), 16);
        const __m512 v = _mm512_castsi512_ps(bits);
        MULTIPLY(v, j)
    }
}

#define GROUP(name, R)                                                                                          \
    case R:                                                                                                     \
        for (long r = 0; r < n; r++) {                                                                          \
            __m512 acc[ROWS > 4 ? ROWS : 4];                                                                    \
            for (int i = 0; i < (ROWS > 4 ? ROWS : 4); i++) acc[i] = _mm512_setzero_ps();                       \
            rows_##name(w + r * row_bytes, x, k, R, acc);                                                       \
            if (R == 1) acc[0] = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])); \
            for (int i = 0; i < R; i++) y[i * n + r] = _mm512_reduce_add_ps(acc[i]);                            \
        }                                                                                                       \
        break;

/* y (rows, n) = x (rows, k) W^T for rows <= ROWS, each row count its own specialised loop (accumulators in registers) */
#define GROUPS(name)                                                                                             \
    static void group_##name(const uint8_t *w, long row_bytes, const float *x, float *y, long n, long k, int rows) { \
        switch (rows) { GROUP(name, 1) GROUP(name, 2) GROUP(name, 3) GROUP(name, 4) GROUP(name, 5) GROUP(name, 6) GROUP(name, 7) GROUP(name, 8) } \
    }
GROUPS(q8_0)
GROUPS(q4_0)
GROUPS(q4_K)
GROUPS(q6_K)
GROUPS(bf16)

typedef void (*group_fn)(const uint8_t *, long, const float *, float *, long, long, int);

static void rows_times_rows(group_fn group, long row_bytes, const uint8_t *w, const float *x, float *y, long m, long n, long k) {
    for (long i0 = 0; i0 < m; i0 += ROWS) group(w, row_bytes, x + i0 * k, y + i0 * n, n, k, (int)(m - i0 < ROWS ? m - i0 : ROWS));
}
#endif

/* Which SIMD this build has: 0 portable, 1 avx2, 2 avx512, 3 avx512 with VNNI, 4 with VNNI and BF16 (checked
 * against the path it was built for). */
int quant_path(void) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
    return 4;
#elif defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return 3;
#elif defined(__AVX512F__)
    return 2;
#elif defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

/* y (m, n) = x (m, k) W^T for W's n rows of `format` blocks; k a whole number of blocks (bf16: of 32). */
int quant_linear(int format, const uint8_t *w, const float *x, float *y, long m, long n, long k) {
#if defined(__AVX512F__)
    switch (format) {
    case F_Q8_0: rows_times_rows(group_q8_0, k / 32 * 34, w, x, y, m, n, k); return 0;
    case F_Q4_0: rows_times_rows(group_q4_0, k / 32 * 18, w, x, y, m, n, k); return 0;
    case F_Q4_K: rows_times_rows(group_q4_K, k / QK_K * 144, w, x, y, m, n, k); return 0;
    case F_Q6_K: rows_times_rows(group_q6_K, k / QK_K * 210, w, x, y, m, n, k); return 0;
    case F_BF16: rows_times_rows(group_bf16, k * 2, w, x, y, m, n, k); return 0;
    default: return -1;
    }
#else
    switch (format) {
    case F_Q8_0: rows_times_blocks(expand_q8_0, 32, 34, w, x, y, m, n, k, 0, n); return 0;
    case F_Q4_0: rows_times_blocks(expand_q4_0, 32, 18, w, x, y, m, n, k, 0, n); return 0;
    case F_Q4_K: rows_times_blocks(expand_q4_K, QK_K, 144, w, x, y, m, n, k, 0, n); return 0;
    case F_Q6_K: rows_times_blocks(expand_q6_K, QK_K, 210, w, x, y, m, n, k, 0, n); return 0;
    case F_BF16: rows_times_blocks(expand_bf16, 32, 64, w, x, y, m, n, k, 0, n); return 0;
    default: return -1;
    }
#endif
}

/* out (n, k) = W's n rows of `format` blocks as fp32: ggml's dequantize_row_*, value for value. */
int quant_dequantize(int format, const uint8_t *w, float *out, long n, long k) {
    expand_fn expand;
    int block, type_size;
    switch (format) {
    case F_Q8_0: expand = expand_q8_0, block = 32, type_size = 34; break;
    case F_Q4_0: expand = expand_q4_0, block = 32, type_size = 18; break;
    case F_Q4_K: expand = expand_q4_K, block = QK_K, type_size = 144; break;
    case F_Q6_K: expand = expand_q6_K, block = QK_K, type_size = 210; break;
    case F_BF16: expand = expand_bf16, block = 32, type_size = 64; break;
    default: return -1;
    }
    const long blocks = n * (k / block);
    for (long b = 0; b < blocks; b++) expand(w + b * type_size, out + b * block);
    return 0;
}

#define XROWS 4 /* input rows multiplied together with each unpacked weight block (more go in groups of XROWS) */
/* y (m, n) = x W^T: one weight row at a time, multiplied into up to XROWS rows of x by isa_name (R a constant in each copy) */
#define ROWS_OF(isa, name)                                                                                                    \
    static void rows_##isa##_##name(const uint8_t *w, long row_bytes, const rounded_t *x, long m, long n, long k, float *y) { \
        for (long r = 0; r < n; r++)                                                                                          \
            for (long i = 0; i < m; i += XROWS) {                                                                             \
                const uint8_t *row = w + r * row_bytes;                                                                       \
                float *out = y + i * n + r;                                                                                   \
                switch (m - i < XROWS ? m - i : XROWS) {                                                                      \
                case 1: isa##_##name(row, x + i, k, out, n, 1); break;                                                        \
                case 2: isa##_##name(row, x + i, k, out, n, 2); break;                                                        \
                case 3: isa##_##name(row, x + i, k, out, n, 3); break;                                                        \
                default: isa##_##name(row, x + i, k, out, n, 4); break;                                                       \
                }                                                                                                             \
            }                                                                                                                 \
    }

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
/* --- int8 activations (the avx512_vnni build): llama.cpp's way ------------------------------------------------
 * Each input row is rounded to int8 once a product, in blocks of 32 (q8_0's levels: scale = max |x| / 127), then
 * each weight block's integer levels are multiplied with it in integers (vpdpbusd: unsigned weight bytes times
 * signed activation bytes, four products summed into each int32 lane, 64 weights an instruction) and scaled once
 * a block. Signed levels are made unsigned by an offset (q8_0: + 128, q4_0: + 8 as stored, q6_K: + 32 as
 * stored), whose product with the activations is computed once a product and starts each sum. One weight row is
 * streamed at a time, its blocks fetched 4 KB ahead, each block unpacked once for up to XROWS input rows. The
 * result is the product of the dequantized weights with the activations as q8_0 holds them: within about 1/254
 * of each block's largest activation of the fp32 product, as llama.cpp's CPU products are. */

#include <stdlib.h>

/* One weight row at a time: two or four rows together (to share the activations' loads, as ggml does) measured
 * slower here (cold weights, AMD EPYC: 1.5-2.5x), the rows' streams competing. */

typedef struct {
    const int8_t *q;    /* k64 int8 levels (k rounded up to 64, the tail zero) */
    const float *d;     /* k64 / 32 scales (the tail zero) */
    const float *xs;    /* k64 / 32 scales times the sums of their block's levels (q4_K's minimums) */
    const __m512 *dx;   /* k64 / 64 vectors: lanes 0-7 the scale of a 32-block, lanes 8-15 the next one's */
    const __m512i *off; /* k64 / 64 vectors: - offset times the sum of each lane's 4 levels (what a dot starts at) */
} rounded_t;

static void round_row(const float *x, long k, int offset, int8_t *q, float *d, float *xs, __m512 *dx, __m512i *off) {
    const long k64 = (k + 63) / 64 * 64;
    memset(q + k, 0, (size_t)(k64 - k));
    for (long b = 0; b < k / 32; b++) {
        const __m512 a = _mm512_loadu_ps(x + 32 * b), c = _mm512_loadu_ps(x + 32 * b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
        const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inverse)));
        const __m512i qc = _mm512_cvtps_epi32(_mm512_mul_ps(c, _mm512_set1_ps(inverse)));
        _mm_storeu_si128((__m128i *)(q + 32 * b), _mm512_cvtsepi32_epi8(qa));
        _mm_storeu_si128((__m128i *)(q + 32 * b + 16), _mm512_cvtsepi32_epi8(qc));
        d[b] = scale;
        xs[b] = scale * (float)(_mm512_reduce_add_epi32(qa) + _mm512_reduce_add_epi32(qc));
    }
    for (long b = k / 32; b < k64 / 32; b++) d[b] = 0.0f, xs[b] = 0.0f;
    const __m512i ones = _mm512_set1_epi8(1), minus = _mm512_set1_epi32(-offset);
    const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (long p = 0; p < k64 / 64; p++) {
        const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(q + 64 * p));
        off[p] = _mm512_mullo_epi32(sums, minus);
        dx[p] = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(d + 2 * p))));
    }
}

static inline uint16_t half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* two fp16 scales as a vector: lanes 0-7 the first, 8-15 the second */
static inline __m512 two_scales(uint16_t first, uint16_t second) {
    const __m128 both = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)first | ((uint32_t)second << 16))));
    return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), _mm512_castps128_ps512(both));
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#ifndef AHEAD /* bytes of weights fetched ahead of the loads: 4096 measured 5-10% faster than none (cold weights, AMD EPYC) */
#define AHEAD 4096
#endif
#if AHEAD
#define PREFETCH(p) _mm_prefetch((const char *)(p) + AHEAD, _MM_HINT_T0)
#else
#define PREFETCH(p) (void)(p)
#endif

#define VKERNEL static inline __attribute__((always_inline)) void

/* y[r * n] (r < R) = the dot of weight row w with input row x[r]: each weight block is unpacked once and
 * multiplied into up to XROWS input rows (a served batch); R is a constant in each specialised copy. */
VKERNEL vnni_q8_0(const uint8_t *w, const rounded_t *x, long k, float *y, long n, const int R) {
    __m512 acc[XROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const long blocks = k / 32, pairs = (blocks + 1) / 2;
    for (long p = 0; p < pairs; p++) {
        const uint8_t *b = w + 68 * p;
        PREFETCH(b), PREFETCH(b + 64);
        __m512i q;
        __m512 scale;
        if (2 * p + 1 < blocks) {
            q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 2))), _mm256_loadu_si256((const __m256i *)(b + 36)), 1);
            scale = two_scales(half_at(b), half_at(b + 34));
        } else { /* the last block alone: the upper half's levels are zero, and so is its offset */
            q = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 2)));
            scale = two_scales(half_at(b), 0);
        }
        q = _mm512_xor_si512(q, flip); /* levels + 128: unsigned */
        for (int r = 0; r < R; r++) {
            const __m512i dot = _mm512_dpbusd_epi32(x[r].off[p], q, _mm512_load_si512(x[r].q + 64 * p));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, x[r].dx[p]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r * n] = _mm512_reduce_add_ps(acc[r]);
}

/* 16 bytes of nibbles each from two blocks as one vector of levels 0..15, in the activations' order */
static inline __m512i nibble_pair(const uint8_t *first, const uint8_t *second) {
    const __m256i bytes = _mm256_loadu2_m128i((const __m128i *)second, (const __m128i *)first), low4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(bytes, low4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
    return _mm512_permutex2var_epi64(_mm512_castsi256_si512(lo), _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), _mm512_castsi256_si512(hi));
}

VKERNEL vnni_q4_0(const uint8_t *w, const rounded_t *x, long k, float *y, long n, const int R) {
    __m512 acc[XROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const long blocks = k / 32, pairs = (blocks + 1) / 2;
    for (long p = 0; p < pairs; p++) {
        const uint8_t *b = w + 36 * p;
        PREFETCH(b);
        const int two = 2 * p + 1 < blocks; /* else the last block alone (its partner's activations are zero) */
        const __m512i q = nibble_pair(b + 2, two ? b + 20 : b + 2);
        const __m512 scale = two_scales(half_at(b), two ? half_at(b + 18) : 0);
        for (int r = 0; r < R; r++) {
            const __m512i dot = _mm512_dpbusd_epi32(x[r].off[p], q, _mm512_load_si512(x[r].q + 64 * p));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, x[r].dx[p]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r * n] = _mm512_reduce_add_ps(acc[r]);
}

/* q4_K's 12 bytes of 6-bit scales and minimums as 8 scale bytes then 8 minimum bytes (ggml's unpacking) */
static inline void q4_K_scales(const uint8_t *packed, uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, packed, 12);
    const uint32_t mask6 = 0x3f3f3f3f, mask4 = 0x0f0f0f0f, mask2 = 0x03030303;
    u[3] = ((u[2] >> 4) & mask4) | (((u[1] >> 6) & mask2) << 4);
    const uint32_t minimums_low = u[1] & mask6;
    u[1] = (u[2] & mask4) | (((u[0] >> 6) & mask2) << 4);
    u[2] = minimums_low;
    u[0] &= mask6;
    memcpy(out, u, 16);
}

VKERNEL vnni_q4_K(const uint8_t *w, const rounded_t *x, long k, float *y, long n, const int R) {
    __m512 acc[XROWS];
    __m256 correction[XROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps(), correction[r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (long s = 0; s < k / QK_K; s++) {
        const uint8_t *b = w + 144 * s;
        PREFETCH(b), PREFETCH(b + 64), PREFETCH(b + 128);
        uint8_t sm[16];
        q4_K_scales(b + 4, sm);
        const __m128i packed = _mm_loadu_si128((const __m128i *)sm);
        const __m256 scales = _mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(packed)));
        const __m256 minimums = _mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(b + 2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(packed, 8))));
        __m512 row_scales[XROWS];
        for (int r = 0; r < R; r++) {
            correction[r] = _mm256_fmadd_ps(minimums, _mm256_loadu_ps(x[r].xs + 8 * s), correction[r]);
            row_scales[r] = _mm512_castps256_ps512(_mm256_mul_ps(scales, _mm256_loadu_ps(x[r].d + 8 * s)));
        }
        for (int j = 0; j < 4; j++) { /* sub-blocks 2j (low nibbles) and 2j + 1 (high) of these 32 bytes */
            const __m256i bytes = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * j));
            const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bytes, low4)), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4), 1);
            const __m512i which = _mm512_set_epi32(2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j);
            for (int r = 0; r < R; r++) {
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_load_si512(x[r].q + QK_K * s + 64 * j));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(which, row_scales[r]), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r * n] = _mm512_reduce_add_ps(acc[r]) - hsum256(correction[r]);
}

VKERNEL vnni_q6_K(const uint8_t *w, const rounded_t *x, long k, float *y, long n, const int R) {
    __m512 acc[XROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(3);
    const __m512i shift_a = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0), shift_b = _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4);
    const __m512i first = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), second = _mm512_add_epi32(first, _mm512_set1_epi32(4));
    for (long s = 0; s < k / QK_K; s++) {
        const uint8_t *b = w + 210 * s;
        PREFETCH(b), PREFETCH(b + 64), PREFETCH(b + 128), PREFETCH(b + 192);
        const __m256 d = _mm256_set1_ps(fp16_to_fp32(b + 208));
        for (int half = 0; half < 2; half++) {
            const long p = 4 * s + 2 * half; /* the 64-value pairs of x: p (quarters 0, 1) and p + 1 (quarters 2, 3) */
            const __m512i ql = _mm512_loadu_si512(b + 64 * half);
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * half)));
            const __m512i qa = _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, shift_a), low2), 4));
            const __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, shift_b), low2), 4));
            const __m512 sc = _mm512_castps256_ps512(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 192 + 8 * half))))));
            const __m512 scale_a = _mm512_permutexvar_ps(first, sc), scale_b = _mm512_permutexvar_ps(second, sc);
            for (int r = 0; r < R; r++) {
                const __m512i dot_a = _mm512_dpbusd_epi32(x[r].off[p], qa, _mm512_load_si512(x[r].q + 64 * p));
                const __m512i dot_b = _mm512_dpbusd_epi32(x[r].off[p + 1], qb, _mm512_load_si512(x[r].q + 64 * p + 64));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_a), _mm512_mul_ps(scale_a, x[r].dx[p]), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_b), _mm512_mul_ps(scale_b, x[r].dx[p + 1]), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r * n] = _mm512_reduce_add_ps(acc[r]);
}

#if defined(__AVX512BF16__)
/* bf16 weights times the activations rounded to bf16 (round to nearest even, as llama.cpp rounds them for its bf16
 * products): vdpbf16ps multiplies pairs of bf16 and sums them into fp32 lanes, 32 weights an instruction. */
VKERNEL vnni_bf16(const uint8_t *w, const rounded_t *x, long k, float *y, long n, const int R) {
    __m512 acc[XROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const long chunks = k / 32;
    long c = 0;
    for (; c + 2 <= chunks; c += 2) { /* two chains of sums a row, so that each need not wait for the one before */
        PREFETCH(w + 64 * c), PREFETCH(w + 64 * c + 64);
        const __m512bh v0 = (__m512bh)_mm512_loadu_si512(w + 64 * c), v1 = (__m512bh)_mm512_loadu_si512(w + 64 * c + 64);
        for (int r = 0; r < R; r++) {
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], v0, ((const __m512bh *)x[r].q)[c]);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], v1, ((const __m512bh *)x[r].q)[c + 1]);
        }
    }
    if (c < chunks) {
        const __m512bh v = (__m512bh)_mm512_loadu_si512(w + 64 * c);
        for (int r = 0; r < R; r++) acc[r][0] = _mm512_dpbf16_ps(acc[r][0], v, ((const __m512bh *)x[r].q)[c]);
    }
    for (int r = 0; r < R; r++) y[r * n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}
#endif

ROWS_OF(vnni, q8_0)
ROWS_OF(vnni, q4_0)
ROWS_OF(vnni, q4_K)
ROWS_OF(vnni, q6_K)
#if defined(__AVX512BF16__)
ROWS_OF(vnni, bf16)
#endif

#if defined(__AVX512BF16__)
/* bf16 weights: each input row rounded to bf16 once (k a whole number of 32) */
static int bf16_linear(const uint8_t *w, const float *x, float *y, long m, long n, long k) {
    __m512bh *xb = aligned_alloc(64, (size_t)m * (size_t)k * 2);
    rounded_t *rounded = malloc(sizeof(rounded_t) * (size_t)m);
    if (!xb || !rounded) {
        free(xb), free(rounded);
        return -2;
    }
    for (long i = 0; i < m; i++) {
        for (long c = 0; c < k / 32; c++) /* cvtne2ps_pbh: the second operand's 16 values in the low half */
            xb[i * (k / 32) + c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i * k + 32 * c + 16), _mm512_loadu_ps(x + i * k + 32 * c));
        rounded[i] = (rounded_t){(const int8_t *)(xb + i * (k / 32)), NULL, NULL, NULL, NULL};
    }
    rows_vnni_bf16(w, 2 * k, rounded, m, n, k, y);
    free(xb), free(rounded);
    return 0;
}
#endif

/* y (m, n) = round(x) (m, k) W^T for W's n rows of `format` blocks (q8_0, q4_0, q4_K, q6_K), x rounded to int8
 * in blocks of 32; k a whole number of W's blocks. The avx512_bf16 build also takes bf16 weights, x rounded to bf16.
 * Returns -1 for another format, -2 without memory. */
int quant_linear_int8(int format, const uint8_t *w, const float *x, float *y, long m, long n, long k) {
    void (*rows)(const uint8_t *, long, const rounded_t *, long, long, long, float *);
    long row_bytes;
    int offset;
    switch (format) {
    case F_Q8_0: rows = rows_vnni_q8_0, row_bytes = k / 32 * 34, offset = 128; break;
    case F_Q4_0: rows = rows_vnni_q4_0, row_bytes = k / 32 * 18, offset = 8; break;
    case F_Q4_K: rows = rows_vnni_q4_K, row_bytes = k / QK_K * 144, offset = 0; break;
    case F_Q6_K: rows = rows_vnni_q6_K, row_bytes = k / QK_K * 210, offset = 32; break;
#if defined(__AVX512BF16__)
    case F_BF16: return bf16_linear(w, x, y, m, n, k);
#endif
    default: return -1;
    }
    const long k64 = (k + 63) / 64 * 64, pairs = k64 / 64;
    /* one allocation, 64-byte aligned: per row the vectors (dx, off), then the levels, the scales and the sums */
    const size_t per_row = ((size_t)pairs * 128 + (size_t)k64 + (size_t)k64 / 32 * 8 + 63) / 64 * 64;
    uint8_t *memory = aligned_alloc(64, (size_t)m * per_row);
    rounded_t *rounded = malloc(sizeof(rounded_t) * (size_t)m);
    if (!memory || !rounded) {
        free(memory), free(rounded);
        return -2;
    }
    for (long i = 0; i < m; i++) {
        uint8_t *at = memory + (size_t)i * per_row;
        __m512 *dx = (__m512 *)at;
        __m512i *off = (__m512i *)(at + pairs * 64);
        int8_t *q = (int8_t *)(at + pairs * 128);
        float *d = (float *)(at + pairs * 128 + k64), *xs = d + k64 / 32;
        round_row(x + i * k, k, offset, q, d, xs, dx, off);
        rounded[i] = (rounded_t){q, d, xs, dx, off};
    }
    rows(w, row_bytes, rounded, m, n, k, y);
    free(memory), free(rounded);
    return 0;
}
#elif defined(__AVX2__) && !defined(__AVX512F__)
/* --- int8 activations with AVX2 (the avx2 build's quant_linear_int8, the avx2_int8 path) ------------------------
 * The same rounding, one 32-block a 256-bit vector: vpmaddubsw (unsigned weight bytes times signed activation
 * bytes, pairs summed into int16) then vpmaddwd by ones (int32 lanes of 4 products). Levels stay below the int16
 * limit: q4_0, q4_K and q6_K's unsigned levels are at most 63; q8_0's signed levels go in as their magnitude, the
 * activations taking their sign (as ggml does). */

#include <stdlib.h>


typedef struct {
    const int8_t *q;     /* k int8 levels */
    const float *d;      /* k / 32 scales */
    const float *xs;     /* k / 32 scales times the sums of their block's levels (q4_K's minimums) */
    const __m256i *off;  /* k / 32 vectors: - offset times the sum of each lane's 4 levels */
} rounded_t;

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum256_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static inline __m256i lane_dot(__m256i weight_u8, __m256i x_s8) { /* 8 int32 lanes, each the sum of 4 products */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(weight_u8, x_s8), _mm256_set1_epi16(1));
}

static void round_row(const float *x, long k, int offset, int8_t *q, float *d, float *xs, __m256i *off) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (long b = 0; b < k / 32; b++) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) v[j] = _mm256_loadu_ps(x + 32 * b + 8 * j), amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float scale = _mm_cvtss_f32(m4) / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        __m256i i[4];
        for (int j = 0; j < 4; j++) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], _mm256_set1_ps(inverse)));
        /* int32 -> int8 with saturation, then undo the lane interleaving of the packs */
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        const __m256i levels = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), levels);
        d[b] = scale;
        const __m256i sums = lane_dot(_mm256_set1_epi8(1), levels);
        xs[b] = scale * (float)hsum256_epi32(sums);
        off[b] = _mm256_mullo_epi32(sums, _mm256_set1_epi32(-offset));
    }
}

#define AKERNEL static inline __attribute__((always_inline)) void

AKERNEL avx2_q8_0(const uint8_t *w, const rounded_t *x, long k, float *y, long n, const int R) {
    __m256 acc[XROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (long b = 0; b < k / 32; b++) {
        const uint8_t *block = w + 34 * b;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(block + 2)), magnitude = _mm256_sign_epi8(q, q);
        const float dw = fp16_to_fp32(block);
        for (int r = 0; r < R; r++) {
            const __m256i dot = lane_dot(magnitude, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x[r].q + 32 * b)), q));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * x[r].d[b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r * n] = hsum256(acc[r]);
}

AKERNEL avx2_q4_0(const uint8_t *w, const rounded_t *x, long k, float *y, long n, const int R) {
    __m256 acc[XROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (long b = 0; b < k / 32; b++) {
        const uint8_t *block = w + 18 * b;
        const __m128i bytes = _mm_loadu_si128((const __m128i *)(block + 2));
        const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), low4); /* 0..15 */
        const float dw = fp16_to_fp32(block);
        for (int r = 0; r < R; r++) {
            const __m256i dot = _mm256_add_epi32(x[r].off[b], lane_dot(q, _mm256_loadu_si256((const __m256i *)(x[r].q + 32 * b))));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * x[r].d[b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r * n] = hsum256(acc[r]);
}

AKERNEL avx2_q4_K(const uint8_t *w, const rounded_t *x, long k, float *y, long n, const int R) {
    __m256 acc[XROWS], correction[XROWS];
    for (int r = 0; r < R; r++) acc[r] = correction[r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (long s = 0; s < k / QK_K; s++) {
        const uint8_t *b = w + 144 * s;
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; j++) scale_min_k4(j, b + 4, &sc[j], &mn[j]);
        const __m256 scales = _mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc))));
        const __m256 minimums = _mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(b + 2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn))));
        float row_scales[XROWS][8];
        for (int r = 0; r < R; r++) {
            correction[r] = _mm256_fmadd_ps(minimums, _mm256_loadu_ps(x[r].xs + 8 * s), correction[r]);
            _mm256_storeu_ps(row_scales[r], _mm256_mul_ps(scales, _mm256_loadu_ps(x[r].d + 8 * s)));
        }
        for (int j = 0; j < 4; j++) { /* sub-blocks 2j (low nibbles) and 2j + 1 (high) of these 32 bytes */
            const __m256i bytes = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * j));
            const __m256i lo = _mm256_and_si256(bytes, low4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
            for (int r = 0; r < R; r++) {
                const int8_t *xq = x[r].q + QK_K * s + 64 * j;
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_dot(lo, _mm256_loadu_si256((const __m256i *)xq))), _mm256_set1_ps(row_scales[r][2 * j]), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_dot(hi, _mm256_loadu_si256((const __m256i *)(xq + 32)))), _mm256_set1_ps(row_scales[r][2 * j + 1]), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r * n] = hsum256(acc[r]) - hsum256(correction[r]);
}

AKERNEL avx2_q6_K(const uint8_t *w, const rounded_t *x, long k, float *y, long n, const int R) {
    __m256 acc[XROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(3);
    for (long s = 0; s < k / QK_K; s++) {
        const uint8_t *b = w + 210 * s;
        const float d = fp16_to_fp32(b + 208);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = b + 64 * half;
            const int8_t *sc = (const int8_t *)(b + 192) + 8 * half;
            const __m256i high_bits = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * half));
            for (int quarter = 0; quarter < 4; quarter++) {
                const long block = 8 * s + 4 * half + quarter; /* values 32 * block .. + 31 */
                const __m256i lowb = _mm256_loadu_si256((const __m256i *)(ql + (quarter & 1) * 32));
                const __m256i lo = _mm256_and_si256(quarter >> 1 ? _mm256_srli_epi16(lowb, 4) : lowb, low4);
                const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high_bits, 2 * quarter), low2), 4);
                const __m256i q = _mm256_or_si256(lo, hi); /* 0..63 */
                const __m256 scale = _mm256_set_m128(_mm_set1_ps(d * sc[2 * quarter + 1]), _mm_set1_ps(d * sc[2 * quarter])); /* lanes 0-3: values 0-15 */
                for (int r = 0; r < R; r++) {
                    const __m256i dot = _mm256_add_epi32(x[r].off[block], lane_dot(q, _mm256_loadu_si256((const __m256i *)(x[r].q + 32 * block))));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, _mm256_set1_ps(x[r].d[block])), acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) y[r * n] = hsum256(acc[r]);
}

ROWS_OF(avx2, q8_0)
ROWS_OF(avx2, q4_0)
ROWS_OF(avx2, q4_K)
ROWS_OF(avx2, q6_K)

int quant_linear_int8(int format, const uint8_t *w, const float *x, float *y, long m, long n, long k) {
    void (*rows)(const uint8_t *, long, const rounded_t *, long, long, long, float *);
    long row_bytes;
    int offset;
    switch (format) {
    case F_Q8_0: rows = rows_avx2_q8_0, row_bytes = k / 32 * 34, offset = 0; break;
    case F_Q4_0: rows = rows_avx2_q4_0, row_bytes = k / 32 * 18, offset = 8; break;
    case F_Q4_K: rows = rows_avx2_q4_K, row_bytes = k / QK_K * 144, offset = 0; break;
    case F_Q6_K: rows = rows_avx2_q6_K, row_bytes = k / QK_K * 210, offset = 32; break;
    default: return -1;
    }
    const long blocks = k / 32;
    /* one allocation, 32-byte aligned: per row the offsets, then the levels, the scales and the sums */
    const size_t per_row = ((size_t)blocks * 32 + (size_t)k + (size_t)blocks * 8 + 31) / 32 * 32;
    uint8_t *memory = aligned_alloc(32, (size_t)m * per_row);
    rounded_t *rounded = malloc(sizeof(rounded_t) * (size_t)m);
    if (!memory || !rounded) {
        free(memory), free(rounded);
        return -2;
    }
    for (long i = 0; i < m; i++) {
        uint8_t *at = memory + (size_t)i * per_row;
        __m256i *off = (__m256i *)at;
        int8_t *q = (int8_t *)(at + blocks * 32);
        float *d = (float *)(at + blocks * 32 + k), *xs = d + blocks;
        round_row(x + i * k, k, offset, q, d, xs, off);
        rounded[i] = (rounded_t){q, d, xs, off};
    }
    rows(w, row_bytes, rounded, m, n, k, y);
    free(memory), free(rounded);
    return 0;
}
#else
int quant_linear_int8(int format, const uint8_t *w, const float *x, float *y, long m, long n, long k) {
    (void)format, (void)w, (void)x, (void)y, (void)m, (void)n, (void)k;
    return -1; /* not this build */
}
#endif
