/* Tree-ensemble walks for the CPU backend's TreeEnsemble kernels (op_ml_tree_ensemble.py).
 *
 * The trees arrive compiled into flat arrays indexed by a global node index; the Python side
 * has checked that every child index is valid, every feature index is inside a row and that
 * no tree has a cycle, so every walk ends on a leaf. Rules: 0 LEQ, 1 LT, 2 GTE, 3 GT, 4 EQ,
 * 5 NEQ, 6 LEAF; a NaN feature goes the way `missing` says. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

static inline int go_true(double v, double t, int8_t rule, uint8_t missing) {
    if (isnan(v)) return missing;
    switch (rule) {
        case 0: return v <= t;
        case 1: return v < t;
        case 2: return v >= t;
        case 3: return v > t;
        case 4: return v == t;
        default: return v != t;
    }
}

#define WALK(NAME, TYPE)                                                                      \
    EXPORT void NAME(const TYPE *x, int64_t rows, int64_t cols, const int64_t *feature,       \
                     const double *threshold, const int8_t *rule, const int64_t *true_child,  \
                     const int64_t *false_child, const uint8_t *missing, const int64_t *roots, \
                     int64_t trees, int64_t *leaves) {                                        \
        for (int64_t r = 0; r < rows; r++) {                                                  \
            const TYPE *row = x + r * cols;                                                   \
            for (int64_t t = 0; t < trees; t++) {                                             \
                int64_t k = roots[t];                                                         \
                while (rule[k] != 6) {                                                        \
                    double v = (double)row[feature[k]];                                       \
                    k = go_true(v, threshold[k], rule[k], missing[k]) ? true_child[k]         \
                                                                      : false_child[k];       \
                }                                                                             \
                leaves[r * trees + t] = k;                                                    \
            }                                                                                 \
        }                                                                                     \
    }

WALK(tree_leaves_f32, float)
WALK(tree_leaves_f64, double)

/* out[r, c] = sum over trees of table[leaves[r, t], c], added in tree order in TYPE (float
 * for float input, as onnxruntime accumulates: in float64 an exact 0.5 tie picks the other
 * label than onnxruntime's 0.50000006). */
#define LEAF_SUM(NAME, TYPE)                                                                  \
    EXPORT void NAME(const int64_t *leaves, int64_t rows, int64_t trees, const TYPE *table,   \
                     int64_t width, TYPE *out) {                                              \
        for (int64_t r = 0; r < rows; r++) {                                                  \
            TYPE *o = out + r * width;                                                        \
            for (int64_t c = 0; c < width; c++) o[c] = 0;                                     \
            for (int64_t t = 0; t < trees; t++) {                                             \
                const TYPE *w = table + leaves[r * trees + t] * width;                        \
                for (int64_t c = 0; c < width; c++) o[c] += w[c];                             \
            }                                                                                 \
        }                                                                                     \
    }

LEAF_SUM(leaf_sum_f32, float)
LEAF_SUM(leaf_sum_f64, double)

/* The walk and the sum in one pass (no [rows, trees] leaf array): out[r, c] = sum over trees,
 * in tree order, of table[leaf reached by row r in tree t, c], accumulated in TYPE exactly as
 * leaf_sum_* does. */
#define WALK_SUM(NAME, TYPE)                                                                  \
    EXPORT void NAME(const TYPE *x, int64_t rows, int64_t cols, const int64_t *feature,       \
                     const double *threshold, const int8_t *rule, const int64_t *true_child,  \
                     const int64_t *false_child, const uint8_t *missing, const int64_t *roots, \
                     int64_t trees, const TYPE *table, int64_t width, TYPE *out) {            \
        for (int64_t r = 0; r < rows; r++) {                                                  \
            const TYPE *row = x + r * cols;                                                   \
            TYPE *o = out + r * width;                                                        \
            for (int64_t c = 0; c < width; c++) o[c] = 0;                                     \
            for (int64_t t = 0; t < trees; t++) {                                             \
                int64_t k = roots[t];                                                         \
                while (rule[k] != 6) {                                                        \
                    double v = (double)row[feature[k]];                                       \
                    k = go_true(v, threshold[k], rule[k], missing[k]) ? true_child[k]         \
                                                                      : false_child[k];       \
                }                                                                             \
                const TYPE *w = table + k * width;                                            \
                for (int64_t c = 0; c < width; c++) o[c] += w[c];                             \
            }                                                                                 \
        }                                                                                     \
    }

WALK_SUM(tree_sum_f32, float)
WALK_SUM(tree_sum_f64, double)

/* The same walk and sum over nodes packed one struct each (one cache line holds a node's
 * every field, where the flat arrays cost a line per field), numpy's aligned record
 * [threshold f8, feature i4, true i4, false i4, rule i1, missing u1] (24 bytes). When every
 * branch is BRANCH_LEQ (scikit-learn's trees) the rule switch is skipped: NaN <= t is false,
 * so a NaN goes false unless `missing` sends it true, as go_true does. */
typedef struct {
    double threshold;
    int32_t feature, true_child, false_child;
    int8_t rule;
    uint8_t missing;
} packed_node;

/* Rows go in blocks of ROW_BLOCK, each block through one tree at a time, so a tree's nodes
 * stay in cache while the block walks it (a big forest does not fit in L2; row by row, every
 * row would stream every tree). Each row still adds its trees' weights in tree order. */
#define ROW_BLOCK 64

#define PACKED_RANGE(NAME, TYPE)                                                                \
    static void NAME(const TYPE *x, int64_t begin, int64_t rows, int64_t cols,                \
                     const packed_node *nodes, const int64_t *roots, int64_t trees,           \
                     int all_leq, const TYPE *table, int64_t width, TYPE *out) {              \
        for (int64_t i = begin * width; i < rows * width; i++) out[i] = 0;                    \
        for (int64_t r0 = begin; r0 < rows; r0 += ROW_BLOCK) {                                \
            int64_t r1 = r0 + ROW_BLOCK < rows ? r0 + ROW_BLOCK : rows;                       \
            for (int64_t t = 0; t < trees; t++) {                                             \
                for (int64_t r = r0; r < r1; r++) {                                           \
                    const TYPE *row = x + r * cols;                                           \
                    int64_t k = roots[t];                                                     \
                    const packed_node *n = nodes + k;                                         \
                    if (all_leq) {                                                            \
                        while (n->rule != 6) {                                                \
                            double v = (double)row[n->feature];                               \
                            k = (v <= n->threshold || (n->missing && isnan(v)))               \
                                    ? n->true_child                                           \
                                    : n->false_child;                                         \
                            n = nodes + k;                                                    \
                        }                                                                     \
                    } else {                                                                  \
                        while (n->rule != 6) {                                                \
                            double v = (double)row[n->feature];                               \
                            k = go_true(v, n->threshold, n->rule, n->missing)                 \
                                    ? n->true_child                                           \
                                    : n->false_child;                                         \
                            n = nodes + k;                                                    \
                        }                                                                     \
                    }                                                                         \
                    const TYPE *w = table + k * width;                                        \
                    TYPE *o = out + r * width;                                                \
                    for (int64_t c = 0; c < width; c++) o[c] += w[c];                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }

PACKED_RANGE(packed_range_f32, float)
PACKED_RANGE(packed_range_f64, double)

/* One thread's share: rows [begin, end) of the walk-and-sum. */
typedef struct {
    int f64;
    const void *x;
    int64_t begin, end, cols;
    const packed_node *nodes;
    const int64_t *roots;
    int64_t trees;
    int all_leq;
    const void *table;
    int64_t width;
    void *out;
} packed_job;

static void *run_packed_job(void *arg) {
    const packed_job *j = (const packed_job *)arg;
    if (j->f64)
        packed_range_f64((const double *)j->x, j->begin, j->end, j->cols, j->nodes, j->roots,
                         j->trees, j->all_leq, (const double *)j->table, j->width,
                         (double *)j->out);
    else
        packed_range_f32((const float *)j->x, j->begin, j->end, j->cols, j->nodes, j->roots,
                         j->trees, j->all_leq, (const float *)j->table, j->width,
                         (float *)j->out);
    return NULL;
}

#define MAX_THREADS 16

/* The walk and sum over `threads` threads, each a contiguous run of row blocks (a row's sum
 * never depends on another row, so the result is the same for any thread count); a thread
 * that cannot be started has its share run by the caller. */
EXPORT void tree_packed_sum(int f64, const void *x, int64_t rows, int64_t cols,
                            const packed_node *nodes, const int64_t *roots, int64_t trees,
                            int all_leq, const void *table, int64_t width, void *out,
                            int threads) {
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    int64_t blocks = (rows + ROW_BLOCK - 1) / ROW_BLOCK;
    if (threads > blocks) threads = blocks > 0 ? (int)blocks : 1;
    packed_job jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 0; i < threads; i++) {
        int64_t b0 = blocks * i / threads, b1 = blocks * (i + 1) / threads;
        int64_t end = b1 * ROW_BLOCK < rows ? b1 * ROW_BLOCK : rows;
        packed_job j = {f64,      x,     b0 * ROW_BLOCK, end,   cols, nodes,
                        roots,    trees, all_leq,        table, width, out};
        jobs[i] = j;
    }
    for (int i = 1; i < threads; i++)
        started[i] = pthread_create(&ids[i], NULL, run_packed_job, &jobs[i]) == 0;
    run_packed_job(&jobs[0]);
    for (int i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(ids[i], NULL);
        else
            run_packed_job(&jobs[i]);
    }
}

/* Several ensembles over the same rows in one call (anychip::TreeEnsembleStack): ensemble g
 * is the next group_trees[g] roots, its sums written to out block g ([rows, width] each),
 * each exactly as tree_packed_sum gives it alone. */
EXPORT void tree_packed_sum_groups(int f64, const void *x, int64_t rows, int64_t cols,
                                   const packed_node *nodes, const int64_t *roots,
                                   const int64_t *group_trees, int64_t groups, int all_leq,
                                   const void *table, int64_t width, void *out, int threads) {
    size_t item = f64 ? sizeof(double) : sizeof(float);
    int64_t first = 0;
    for (int64_t g = 0; g < groups; g++) {
        char *block = (char *)out + (size_t)(g * rows * width) * item;
        tree_packed_sum(f64, x, rows, cols, nodes, roots + first, group_trees[g], all_leq,
                        table, width, block, threads);
        first += group_trees[g];
    }
}
