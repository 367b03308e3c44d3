// Encoders that leave: Tally's parameters under PyTorch's names and layouts, so
// `torch.nn.Module.load_state_dict(strict=True)` takes them (the module tree is in
// docs/reference.md, "Encoders that leave"). Tally's own names already follow torch.nn's
// (blocks.0.attn.qkv.weight, ...); what differs is mapped here, in one place, both ways (export,
// and --init from an export):
//   a family's own names          -> its BackboneDef.torch_name (ResNet: torchvision's conv1,
//                                    bn1, layer1.0.conv1, layer1.0.downsample.0, ...)
//   normalization gamma/beta      -> weight/bias
//   BatchNorm                     -> plus num_batches_tracked (I64 scalar: the steps trained)
//   ViT patch_embed (D, P*P*C)    -> patch_embed.proj, a Conv2d weight (D, C, P, P)
//   ViT cls_token (D)             -> cls_token (1, 1, D)
#pragma once
#include "config.h"
#include "core/params.h"
#include "io/safetensors.h"

// 2: a ResNet's parameters under torchvision's names (1: under Tally's, still read).
#define EXPORT_FORMAT "tally-export-2"

typedef enum { TORCH_COPY, TORCH_PATCH_EMBED } TorchLayout;

typedef struct {
  char name[ST_NAME_MAX];
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  TorchLayout layout;
} TorchTensor;

// PyTorch's name, shape and layout for one Tally parameter entry.
TorchTensor torch_tensor_for(const ParamEntry *e, const ModelSpec *spec, int channels);

// Finds Tally parameter `e` in `f` — a Tally checkpoint (params.NAME) or an export (PyTorch
// names) — and copies it into `out` (e->count floats, Tally's layout). 1 found, 0 absent, -1
// with tl_last_error() naming `what` when the tensor is there with another dtype or shape.
int weights_find(const StFile *f, const ParamEntry *e, const ModelSpec *spec, int channels,
                 float *out, const char *what);

// Writes the encoder of checkpoint `ckpt` (with the projection head, or MAE's decoder, when
// with_head) as safetensors with PyTorch names to `out`. -1 with tl_last_error().
int export_checkpoint(const char *ckpt, const char *out, int with_head);

// Where an export of checkpoint `ckpt` goes unless told: encoder.safetensors beside it (in its
// run folder).
void export_default_path(const char *ckpt, char *out, size_t cap);

// Reads a checkpoint's configuration (its own copy of the recipe and model). -1 on error.
int checkpoint_config(const StFile *ckpt, const char *path, Config *cfg);
