/* word2vec with negative sampling over a span of token ids, as word2vec.c and gensim's word2vec_inner do it:
 * frequent words dropped at random before the windows are taken, a window shrunk at random for each word,
 * negatives drawn from a cumulative unigram^0.75 table, the learning rate falling linearly across the span.
 * Several threads may train the same tables at once on different spans (Hogwild: no locks, as both do).
 *
 * tokens: ids, or -1 where a sentence ends (a document boundary, a special token).
 * input (V, dim): the word vectors (word2vec.c's syn0); output (V, dim): the context vectors (syn1neg).
 * keep[v]: a word is kept when keep[v] >= a random 32-bit number (gensim's sample_int).
 * noise[v]: the cumulative noise distribution, noise[V-1] its total (gensim's cum_table).
 * Returns the summed loss, -log s(u.v) - sum log s(-u.n), over the examples trained; stats[0] += words
 * kept, stats[1] += examples (skip-gram: word-context pairs; CBOW: centre words). */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_EXP 6.0f
#define TABLE_SIZE 1024
#define MAX_SENTENCE 10000 /* gensim's MAX_WORDS_IN_BATCH: a longer sentence is cut */

static float sigmoid_table[TABLE_SIZE + 1];
static float log_sigmoid_table[TABLE_SIZE + 1];
static int tables_ready = 0;

void w2v_init(void) {
    for (int i = 0; i <= TABLE_SIZE; i++) {
        double x = ((double)i / TABLE_SIZE * 2.0 - 1.0) * MAX_EXP;
        sigmoid_table[i] = (float)(1.0 / (1.0 + exp(-x)));
        log_sigmoid_table[i] = (float)(-log1p(exp(-x)));
    }
    tables_ready = 1;
}

static inline uint64_t next_random(uint64_t *state) {
    *state = *state * 25214903917ULL + 11ULL; /* word2vec.c's generator */
    return *state;
}

static inline int table_index(float f) { return (int)((f + MAX_EXP) * (TABLE_SIZE / (2.0f * MAX_EXP))); }

static inline float sigmoid(float f) {
    if (f >= MAX_EXP) return 1.0f;
    if (f <= -MAX_EXP) return 0.0f;
    return sigmoid_table[table_index(f)];
}

/* log s(f), exact enough outside the table: log s(f) ~ f for very negative f, ~ 0 for very positive f */
static inline float log_sigmoid(float f) {
    if (f >= MAX_EXP) return -expf(-f);
    if (f <= -MAX_EXP) return f;
    return log_sigmoid_table[table_index(f)];
}

static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(float g, const float *restrict x, float *restrict y, int n) {
    for (int i = 0; i < n; i++) y[i] += g * x[i];
}

static inline int32_t draw_noise(const uint32_t *noise, int vocab, uint64_t *state) {
    uint32_t r = (uint32_t)((next_random(state) >> 16) % noise[vocab - 1]);
    int lo = 0, hi = vocab - 1; /* the first v with noise[v] > r */
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (noise[mid] > r) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* One example: `hidden` (a context word's vector, or the mean of the context's) predicts `word` against
 * `negatives` noise words; the output vectors are updated, the hidden vector's gradient added to `grad`. */
static float train_example(const float *hidden, int32_t word, float *output, int dim, const uint32_t *noise, int vocab, int negatives, float alpha,
                           uint64_t *state, float *grad) {
    float loss = 0.0f;
    for (int d = 0; d <= negatives; d++) {
        int32_t target = word;
        float label = 1.0f;
        if (d > 0) {
            target = draw_noise(noise, vocab, state);
            if (target == word) continue;
            label = 0.0f;
        }
        float *out = output + (int64_t)target * dim;
        float f = dot(hidden, out, dim);
        loss -= label > 0 ? log_sigmoid(f) : log_sigmoid(-f);
        float g = (label - sigmoid(f)) * alpha;
        axpy(g, out, grad, dim);
        axpy(g, hidden, out, dim);
    }
    return loss;
}

static double train_sentence(const int32_t *sentence, int length, float *input, float *output, int dim, const uint32_t *noise, int vocab, int skipgram,
                             int window, int negatives, float alpha, uint64_t *state, float *work, int64_t *stats) {
    float *grad = work, *hidden = work + dim;
    double loss = 0.0;
    for (int i = 0; i < length; i++) {
        int shrink = (int)((next_random(state) >> 16) % (uint64_t)window);
        int start = i - window + shrink, end = i + window - shrink + 1;
        if (start < 0) start = 0;
        if (end > length) end = length;
        if (skipgram) {
            for (int j = start; j < end; j++) {
                if (j == i) continue;
                float *context = input + (int64_t)sentence[j] * dim;
                memset(grad, 0, sizeof(float) * dim);
                loss += train_example(context, sentence[i], output, dim, noise, vocab, negatives, alpha, state, grad);
                axpy(1.0f, grad, context, dim);
                stats[1]++;
            }
        } else {
            int count = 0;
            memset(hidden, 0, sizeof(float) * dim);
            for (int j = start; j < end; j++) {
                if (j == i) continue;
                axpy(1.0f, input + (int64_t)sentence[j] * dim, hidden, dim);
                count++;
            }
            if (!count) continue;
            float inverse = 1.0f / count;
            for (int k = 0; k < dim; k++) hidden[k] *= inverse; /* the mean of the context (gensim's cbow_mean=1) */
            memset(grad, 0, sizeof(float) * dim);
            loss += train_example(hidden, sentence[i], output, dim, noise, vocab, negatives, alpha, state, grad);
            for (int j = start; j < end; j++) /* each context word gets the whole gradient, as in word2vec.c */
                if (j != i) axpy(1.0f, grad, input + (int64_t)sentence[j] * dim, dim);
            stats[1]++;
        }
    }
    return loss;
}

/* work: 2 * dim floats of scratch, one per calling thread. */
double w2v_train_span(const int32_t *tokens, int64_t n_tokens, float *input, float *output, int dim, const uint32_t *keep, const uint32_t *noise, int vocab,
                      int skipgram, int window, int negatives, float alpha_start, float alpha_end, uint64_t seed, float *work, int64_t *stats) {
    if (!tables_ready) w2v_init();
    int32_t sentence[MAX_SENTENCE];
    uint64_t state = seed;
    double loss = 0.0;
    int length = 0;
    int64_t sentence_start = 0;
    for (int64_t p = 0; p <= n_tokens; p++) {
        int32_t token = p < n_tokens ? tokens[p] : -1;
        if (token >= 0) {
            if ((uint64_t)keep[token] >= ((next_random(&state) >> 16) & 0xFFFFFFFFULL)) {
                sentence[length++] = token;
                stats[0]++;
            }
            if (length < MAX_SENTENCE) continue;
        }
        if (length > 1) {
            float alpha = alpha_start + (alpha_end - alpha_start) * (float)((double)sentence_start / (double)(n_tokens > 0 ? n_tokens : 1));
            loss += train_sentence(sentence, length, input, output, dim, noise, vocab, skipgram, window, negatives, alpha, &state, work, stats);
        }
        length = 0;
        sentence_start = p + 1;
    }
    return loss;
}
