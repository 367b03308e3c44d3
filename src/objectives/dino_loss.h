// DINO's loss (Caron et al. 2021, Algorithm 1; main_dino.py's DINOLoss): the teacher's outputs
// for the G global crops, centred and sharpened, q = softmax((t - c) / tau_t), are the targets of
// the student's outputs for every other crop, log p = log_softmax(s / tau_s). Per sample, the
// cross-entropies -sum_k q log p over the (teacher crop, student crop) pairs of different crops
// are averaged; the loss is their mean over samples. Student crop v < G is the same image crop
// as teacher crop v, so that pair is left out.
// Rows are crop-major: student row v * b + i is crop v of sample i (v < V), teacher row
// g * b + i is global crop g (g < G).
#pragma once
#include "ops/softmax.h"

typedef struct {
  int b, global, views, K;         // samples, teacher (global) crops, student crops, outputs
  float *q;                        // (G b, K) the teacher's targets, MEM_WORKSPACE loss
  float *logp;                     // (V b, K) the student's log-probabilities, MEM_ACT loss
  RowSoftmax teacher_softmax;      // rows of q in place
  RowSoftmax student_log_softmax;  // rows of logp in place
} DinoLoss;

void dino_loss_init(DinoLoss *l, ExecCtx *ctx, int b, int global, int views, int K);
// student: (V b, K) outputs; teacher: (G b, K) outputs; center: (K). Returns the sum over the b
// samples of each one's pair-averaged cross-entropy; dstudent (V b, K) receives the gradient of
// that sum divided by mean_over. Counts its FLOPs in ctx (COMP_LOSS).
double dino_loss_forward_backward(DinoLoss *l, ExecCtx *ctx, const float *student,
                                  const float *teacher, const float *center, float student_temp,
                                  float teacher_temp, int mean_over, float *dstudent);
// The (teacher crop, student crop) pairs each sample's loss averages over.
int dino_loss_pairs(int global, int views);
void dino_loss_destroy(DinoLoss *l);
