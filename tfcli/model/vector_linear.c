/* y = W x + b for one input row: the linear layers of a decoding step at batch 1.
 *
 * The cost is reading W (n rows of k floats) once from memory. Each row is streamed front to back
 * against x, which stays in the L1 cache, into four independent vector accumulators; the rows are split
 * between OpenMP threads. Built by tfcli/model/native.py with -O3 -march=native -fopenmp: the `lanes`
 * type becomes whatever vectors the processor has (AVX-512, AVX2, NEON). When tfcli is loaded the
 * OpenMP runtime is PyTorch's own, so these threads are its threads.
 */
#include <omp.h>

#define LANES 16
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

/* w: (n, k) row-major, x: (k,), bias: (n,) or NULL, y: (n,). Uses `threads` threads once the weight has
 * at least `parallel_from` elements (below that, starting them costs more than they save). */
void vector_linear(const float *w, const float *x, const float *bias, float *y, long n, long k, int threads, long parallel_from) {
    #pragma omp parallel num_threads(threads) if (n * k >= parallel_from)
    {
        long count = omp_get_num_threads(), index = omp_get_thread_num();
        long share = (n + count - 1) / count;
        long first = index * share, last = first + share < n ? first + share : n;
        for (long i = first; i < last; i++) {
            float value = row_dot(w + i * k, x, k);
            y[i] = bias ? value + bias[i] : value;
        }
    }
}
