/* Multi-class probabilities from pairwise ones (Wu, Lin and Weng 2004, method 2, as libsvm
 * and onnxruntime compute it), for the SVMClassifier kernel (op_ml_svm.py).
 * r: [rows, k, k] pairwise probabilities (r[i][j] = P(i | i or j)); p: [rows, k] output. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT int svm_couple(const float *r, int64_t rows, int64_t k, float *p) {
    float *q = malloc(sizeof(float) * (size_t)(k * k + k));
    if (!q) return -1;
    float *qp = q + k * k;
    const float eps = 0.005f / (float)k;
    for (int64_t n = 0; n < rows; n++) {
        const float *rr = r + n * k * k;
        float *pp = p + n * k;
        for (int64_t i = 0; i < k; i++) {
            pp[i] = 1.0f / (float)k;
            q[i * k + i] = 0.0f;
            for (int64_t j = 0; j < i; j++) {
                q[i * k + i] += rr[j * k + i] * rr[j * k + i];
                q[i * k + j] = q[j * k + i];
            }
            for (int64_t j = i + 1; j < k; j++) {
                q[i * k + i] += rr[j * k + i] * rr[j * k + i];
                q[i * k + j] = -rr[j * k + i] * rr[i * k + j];
            }
        }
        for (int iter = 0; iter < 100; iter++) {
            float pqp = 0.0f;
            for (int64_t i = 0; i < k; i++) {
                qp[i] = 0.0f;
                for (int64_t j = 0; j < k; j++) qp[i] += q[i * k + j] * pp[j];
                pqp += pp[i] * qp[i];
            }
            float worst = 0.0f;
            for (int64_t i = 0; i < k; i++) {
                float e = fabsf(qp[i] - pqp);
                if (e > worst) worst = e;
            }
            if (worst < eps) break;
            for (int64_t i = 0; i < k; i++) {
                float diff = (-qp[i] + pqp) / q[i * k + i];
                pp[i] += diff;
                pqp = (pqp + diff * (diff * q[i * k + i] + 2 * qp[i])) / (1 + diff) / (1 + diff);
                for (int64_t j = 0; j < k; j++) {
                    qp[j] = (qp[j] + diff * q[i * k + j]) / (1 + diff);
                    pp[j] /= (1 + diff);
                }
            }
        }
    }
    free(q);
    return 0;
}
