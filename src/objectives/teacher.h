// A momentum teacher: a slowly moving copy of the online network's first parameters, as MoCo's
// key encoder, BYOL's target and DINO's teacher are (solo-learn's BaseMomentumMethod). It owns
// what the three would each write again: the copy's parameters (MEM_MOMENTUM: the ledger's
// momentum_encoder_bytes), the builder its networks take them from, the EMA step along its
// schedule with the drift it reports, its checkpoint entries and its restart after --init.
// Which networks it mirrors, and on which views it runs them, stay the objective's.
//
//   momentum_teacher_begin  -> Builder: build the teacher's networks, in the online order
//   momentum_teacher_ready  after them: every float taken, the copy starts as the online one
//   momentum_teacher_update after each optimizer step
#pragma once
#include "io/safetensors.h"
#include "objectives/objective.h"

typedef struct {
  ParamSet params;       // EMA of the online set's first params.count floats, no gradients
  float momentum;        // m at step 0
  const char *schedule;  // "constant" or "cosine" (m rises to 1 over the run)
} MomentumTeacher;

// The ledger field every teacher reports, ||theta_t - theta_o|| / ||theta_o|| after the update
// (LEDGER_CACHED: the teacher is what is kept between steps; only a run knows it).
#define MOMENTUM_DISTANCE_FIELD \
  { "momentum_distance", LEDGER_CACHED, UNIT_RATIO, 1 }
// The whole declaration for an objective whose only own field is the teacher's drift.
extern const LedgerOwnFields momentum_teacher_fields;

// Allocates the teacher for the online parameters env has handed out so far (the part it
// mirrors, in their order) and returns the forward-only Builder, with the run's policy, that its
// networks take their parameters from.
Builder momentum_teacher_begin(MomentumTeacher *t, const ObjectiveEnv *env, float momentum,
                               const char *schedule);
// After the teacher's networks are built: they took every float, and the copy starts as the
// online network (not in a plan: nothing is real there).
void momentum_teacher_ready(MomentumTeacher *t, const ObjectiveEnv *env);
// One EMA step at 0-based `step` of the run towards the online parameters it mirrors, its drift
// after it in *distance (a ledger field; a plan knows no weights and writes neither).
void momentum_teacher_update(MomentumTeacher *t, const ObjectiveEnv *env, long step,
                             double *distance);
// The online parameters were replaced (--init): the copy starts again from them.
void momentum_teacher_restart(MomentumTeacher *t, const ParamSet *online);
// Its weights (BatchNorm statistics included) in a checkpoint list, each name after `prefix`.
void momentum_teacher_state(MomentumTeacher *t, StFile *s, const char *prefix);
void momentum_teacher_destroy(MomentumTeacher *t);
