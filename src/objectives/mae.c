// mae: masked autoencoder; the encoder sees only the visible patches, a light decoder
// reconstructs the masked ones.
#include "objectives/objective.h"

const ObjectiveDef objective_mae = {
    .name = "mae",
    .description = "Masked autoencoder: encoder on visible patches only, light decoder",
    .implemented = 0,
    .n_views = 1,
};
