// ConvNeXt (nn/convnext.c, models/convnext_tiny.ini): a tiny ConvNeXt (stage_dims 8, 16,
// stage_depths 1, 1 on 16 px) against finite differences, and again under [train] precision = bf16
// against f32; the shipped model file's parameter count against torchvision's published total; the
// export's names and shapes against torchvision's module tree, written out here; and, through the
// binary, a tiny three-stage ConvNeXt planned as it runs and resumed bit for bit on 1 and 2
// replicas. (tests/test_torchvision_convnext.sh loads an export into torchvision's own
// convnext_tiny.)
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "core/counting.h"
#include "gradcheck.h"
#include "objective_test_util.h"
#include "encoder/export.h"

// ---- the network, in process ----

enum { GRAD_N = 2, GRAD_S = 16, GRAD_C = 3 };

typedef struct {
  ExecCtx ctx;
  ParamSet ps;
  BuildPolicy policy;
  Backbone *bb;
  float images[GRAD_N * GRAD_S * GRAD_S * GRAD_C];
  float *R;
} GradCase;

static ModelSpec tiny_convnext_spec(void) {
  ModelSpec m = tiny_model_spec("convnext");
  m.stage_dims[0] = 8;
  m.stage_dims[1] = 16;
  m.stage_depths[0] = m.stage_depths[1] = 1;
  return m;
}

static int ends_with(const char *s, const char *tail) {
  const size_t n = strlen(s), t = strlen(tail);
  return n >= t && strcmp(s + n - t, tail) == 0;
}

// The tiny network built on identical parameters (seed 3) under `policy`. The layer scales are
// set to 0.5-1.5 and the biases and shifts away from 0: at torchvision's 1e-6 a block's branch
// would hardly reach the feature, and finite differences could not see a wrong gradient in it.
static void case_open(GradCase *c, int bf16, int recompute) {
  const ModelSpec spec = tiny_convnext_spec();
  exec_ctx_init(&c->ctx);
  paramset_alloc(&c->ps, backbone_param_count(&spec, GRAD_S, GRAD_C), 3);
  c->policy = build_policy_default();
  c->policy.bf16 = bf16;
  c->policy.recompute = recompute;
  Builder b = {.ctx = &c->ctx, .params = &c->ps, .mode = OP_TRAIN, .policy = &c->policy};
  c->bb = backbone_create(&spec, &b, GRAD_N, GRAD_S, GRAD_C);
  Rng r = rng_stream(11, RNG_TEST, 0, 0);
  for (int e = 0; e < c->ps.n_entries; e++) {
    const ParamEntry *pe = &c->ps.entries[e];
    float *p = c->ps.data + pe->offset;
    if (ends_with(pe->name, "layer_scale"))
      for (size_t i = 0; i < pe->count; i++) p[i] = rng_uniform_range(&r, 0.5f, 1.5f);
    if (ends_with(pe->name, ".bias") || ends_with(pe->name, ".beta"))
      for (size_t i = 0; i < pe->count; i++) p[i] = rng_uniform_range(&r, -0.2f, 0.2f);
  }
  c->R = calloc((size_t)GRAD_N * c->bb->feature_dim, sizeof *c->R);
  for (size_t i = 0; i < sizeof c->images / sizeof c->images[0]; i++) c->images[i] = rng_normal(&r);
  for (int i = 0; i < GRAD_N * c->bb->feature_dim; i++) c->R[i] = rng_normal(&r);
}

static void case_close(GradCase *c) {
  free(c->R);
  c->bb->destroy(c->bb);
  paramset_free(&c->ps);
  exec_ctx_destroy(&c->ctx);
}

static double feature_loss(void *arg) {
  GradCase *c = arg;
  c->bb->forward(c->bb, &c->ctx, c->images);
  double s = 0;
  for (int i = 0; i < GRAD_N * c->bb->feature_dim; i++) s += (double)c->bb->feature[i] * c->R[i];
  return s;
}

static void case_backward(GradCase *c) {
  paramset_zero_grad(&c->ps, 0);
  feature_loss(c);
  c->bb->backward(c->bb, &c->ctx, c->R);
}

// Every parameter tensor's gradient, sampled, against central differences: LayerNorm and GELU
// are smooth, so a tight tolerance holds. With [train] recompute the blocks' norm and GELU
// outputs are written again before the linear layers' backward reads them; without, kept.
static void check_gradient(int recompute) {
  GradCase *c = calloc(1, sizeof *c);
  case_open(c, 0, recompute);
  assert_int_equal(c->bb->feature_dim, 16);
  assert_int_equal(backbone_feature_dim(&(ModelSpec){.type = "convnext", .stage_dims = {8, 16}}),
                   16);
  assert_int_equal(c->ps.used, c->ps.count);
  case_backward(c);
  float *analytic = malloc(sizeof(float) * c->ps.count);
  memcpy(analytic, c->ps.grad, sizeof(float) * c->ps.count);
  int checked = 0;
  for (int e = 0; e < c->ps.n_entries; e++) {
    const ParamEntry *pe = &c->ps.entries[e];
    assert_false(pe->is_buffer);  // LayerNorm keeps no running statistics
    double err = gradcheck(feature_loss, c, c->ps.data + pe->offset, analytic + pe->offset,
                           pe->count, 8, 1e-2f, 1e-2, pe->name);
    assert_true(err < 1e-2);
    checked++;
  }
  // The stem's conv and norm; per block the depthwise conv, norm, fc1, fc2 (weight and bias
  // each) and the layer scale; the downsampling's norm and conv; the final norm.
  assert_int_equal(checked, 4 + 9 + 4 + 9 + 2);
  free(analytic);
  case_close(c);
  free(c);
}

static void test_tiny_convnext_gradient(void **state) {
  (void)state;
  check_gradient(1);
}

static void test_tiny_convnext_gradient_kept(void **state) {
  (void)state;
  check_gradient(0);
}

// bf16 compute (f32 activations) gives the f32 features and gradients to bf16's precision.
static double relative_error(const float *got, const float *want, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    diff += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
    norm += (double)want[i] * want[i];
  }
  return sqrt(diff / norm);
}

static void test_bf16_runs_like_f32(void **state) {
  (void)state;
  GradCase *f = calloc(1, sizeof *f), *h = calloc(1, sizeof *h);
  case_open(f, 0, 1);
  case_open(h, 1, 1);
  case_backward(f);
  case_backward(h);
  const size_t nf = (size_t)GRAD_N * f->bb->feature_dim;
  const double ef = relative_error(h->bb->feature, f->bb->feature, nf);
  const double eg = relative_error(h->ps.grad, f->ps.grad, f->ps.count);
  print_message("bf16 against f32: features %.2e, gradients %.2e (relative)\n", ef, eg);
  assert_true(ef > 1e-6 && ef < 3e-2);  // bf16 ran, and ran right
  assert_true(eg > 1e-6 && eg < 5e-2);
  case_close(f);
  case_close(h);
  free(f);
  free(h);
}

// ---- the shipped model file ----

static void load_tiny_file(Config *cfg, const char *file, int image_size) {
  config_defaults(cfg);
  if (config_load_model(cfg, file) != 0) fail_msg("%s", tl_last_error());
  cfg->data.image_size = image_size;
  cfg->data.channels = 3;
  if (config_validate(cfg) != 0) fail_msg("%s", tl_last_error());
}

// torchvision.models.convnext_tiny: 28,589,128 parameters, less the classifier's Linear (768
// inputs x 1000 classes + 1000 biases). No buffers on either side.
static void test_model_file_counts_as_torchvision(void **state) {
  (void)state;
  Config cfg;
  load_tiny_file(&cfg, "models/convnext_tiny.ini", 224);
  const size_t got = backbone_param_count(&cfg.model.spec, 224, 3);
  print_message("models/convnext_tiny.ini: %zu parameters\n", got);
  assert_int_equal(got, 28589128L - (768L * 1000 + 1000));
  assert_int_equal(backbone_feature_dim(&cfg.model.spec), 768);
}

// Fewer than 32 px leave the last of four stages no pixel; pad_to is not convnext's.
static void test_model_file_checks(void **state) {
  (void)state;
  Config cfg;
  config_defaults(&cfg);
  if (config_load_model(&cfg, "models/convnext_tiny.ini") != 0) fail_msg("%s", tl_last_error());
  cfg.data.image_size = 28;
  assert_int_equal(config_validate(&cfg), -1);
  assert_non_null(strstr(tl_last_error(), "at least 32 px, not 28"));
  cfg.data.image_size = 32;
  assert_int_equal(config_validate(&cfg), 0);
  cfg.model.spec.stage_depths[3] = 0;
  assert_int_equal(config_validate(&cfg), -1);
  assert_non_null(strstr(tl_last_error(), "stage_dims has 4, stage_depths 3"));
}

typedef struct {
  char name[64];
  int ndim;
  long shape[4];
} TorchEntry;

// torchvision's ConvNeXt tensors for `dims` and `depths` (4 stages), the classifier's Linear
// left out: features.0 the stem (conv, LayerNorm2d), features.(2s+1) stage s's CNBlocks (their
// own layer_scale, then block.0 the depthwise conv, block.2 the LayerNorm, block.3 and block.5
// the Linears), features.(2s) for s >= 1 the downsampling (LayerNorm2d, conv), classifier.0.
static int torchvision_convnext(const int *dims, const int *depths, TorchEntry *t, int cap) {
  int n = 0;
#define ENTRY(nd, s0, s1, s2, s3, ...)                                 \
  do {                                                                 \
    if (n < cap) {                                                     \
      snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);              \
      t[n].ndim = nd;                                                  \
      memcpy(t[n].shape, (long[]){s0, s1, s2, s3}, sizeof t[n].shape); \
    }                                                                  \
    n++;                                                               \
  } while (0)
  ENTRY(4, dims[0], 3, 4, 4, "features.0.0.weight");
  ENTRY(1, dims[0], 0, 0, 0, "features.0.0.bias");
  ENTRY(1, dims[0], 0, 0, 0, "features.0.1.weight");
  ENTRY(1, dims[0], 0, 0, 0, "features.0.1.bias");
  for (int s = 0; s < 4; s++) {
    const long c = dims[s];
    if (s > 0) {
      ENTRY(1, dims[s - 1], 0, 0, 0, "features.%d.0.weight", 2 * s);
      ENTRY(1, dims[s - 1], 0, 0, 0, "features.%d.0.bias", 2 * s);
      ENTRY(4, c, dims[s - 1], 2, 2, "features.%d.1.weight", 2 * s);
      ENTRY(1, c, 0, 0, 0, "features.%d.1.bias", 2 * s);
    }
    for (int b = 0; b < depths[s]; b++) {
      const int f = 2 * s + 1;
      ENTRY(3, c, 1, 1, 0, "features.%d.%d.layer_scale", f, b);
      ENTRY(4, c, 1, 7, 7, "features.%d.%d.block.0.weight", f, b);
      ENTRY(1, c, 0, 0, 0, "features.%d.%d.block.0.bias", f, b);
      ENTRY(1, c, 0, 0, 0, "features.%d.%d.block.2.weight", f, b);
      ENTRY(1, c, 0, 0, 0, "features.%d.%d.block.2.bias", f, b);
      ENTRY(2, 4 * c, c, 0, 0, "features.%d.%d.block.3.weight", f, b);
      ENTRY(1, 4 * c, 0, 0, 0, "features.%d.%d.block.3.bias", f, b);
      ENTRY(2, c, 4 * c, 0, 0, "features.%d.%d.block.5.weight", f, b);
      ENTRY(1, c, 0, 0, 0, "features.%d.%d.block.5.bias", f, b);
    }
  }
  ENTRY(1, dims[3], 0, 0, 0, "classifier.0.weight");
  ENTRY(1, dims[3], 0, 0, 0, "classifier.0.bias");
#undef ENTRY
  return n;
}

// Every exported tensor is one of torchvision's, of its shape, and every one of torchvision's is
// exported once (the counts are equal and no name repeats).
static void test_export_names_are_torchvision(void **state) {
  (void)state;
  Config cfg;
  load_tiny_file(&cfg, "models/convnext_tiny.ini", 224);
  CountingPass pass;
  counting_begin(&pass, 0);
  Builder b = {.ctx = &pass.ctx, .params = &pass.ps, .mode = OP_INFER};
  Backbone *bb = backbone_create(&cfg.model.spec, &b, 2, 224, 3);
  bb->destroy(bb);
  static TorchEntry want[400];
  static int seen[400];
  const int n =
      torchvision_convnext((const int[]){96, 192, 384, 768}, (const int[]){3, 3, 9, 3}, want, 400);
  assert_int_equal(n, 4 + 3 * 4 + 18 * 9 + 2);
  assert_int_equal(pass.ps.n_entries, n);
  for (int i = 0; i < n; i++) {
    const TorchTensor t = torch_tensor_for(&pass.ps.entries[i], &cfg.model.spec, 3);
    int k = 0;
    while (k < n && strcmp(want[k].name, t.name) != 0) k++;
    if (k == n)
      fail_msg("%s exports as %s, not a name of torchvision's convnext_tiny",
               pass.ps.entries[i].name, t.name);
    assert_int_equal(seen[k]++, 0);
    assert_int_equal(t.ndim, want[k].ndim);
    for (int d = 0; d < t.ndim; d++)
      if (t.shape[d] != want[k].shape[d])
        fail_msg("%s: dimension %d is %ld, torchvision's %ld", t.name, d, (long)t.shape[d],
                 want[k].shape[d]);
  }
  counting_end(&pass);
}

// ---- through the binary: a tiny three-stage ConvNeXt ----

static char tiny_file[600], tiny_args[1024];

// 28 px: the stem leaves 7 a side, the stages 7, 3 and 1.
static void write_tiny(void) {
  snprintf(tiny_file, sizeof tiny_file, "%s/tiny-convnext.ini", tmpdir);
  FILE *f = fopen(tiny_file, "w");
  assert_non_null(f);
  fprintf(f, "[backbone]\ntype = convnext\nstage_dims = 8,16,32\nstage_depths = 1,1,2\n");
  fclose(f);
  snprintf(tiny_args, sizeof tiny_args,
           "--objective=inbatch --set model.file=%s --set train.batch_size=32 --set "
           "data.limit=256 --set data.test_limit=128",
           tiny_file);
}

static void test_tiny_plan_equals_run(void **state) {
  (void)state;
  plan_equals_run("convnext-plan", tiny_args, "");
}

static void test_tiny_resume_is_bit_exact(void **state) {
  (void)state;
  expect_stop_and_resume_bit_exact(tiny_args, NULL);
}

int main(void) {
  objective_register_config();
  if (cli_test_init("convnext") != 0) return 1;
  write_tiny();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tiny_convnext_gradient),
      cmocka_unit_test(test_tiny_convnext_gradient_kept),
      cmocka_unit_test(test_bf16_runs_like_f32),
      cmocka_unit_test(test_model_file_counts_as_torchvision),
      cmocka_unit_test(test_model_file_checks),
      cmocka_unit_test(test_export_names_are_torchvision),
      cmocka_unit_test(test_tiny_plan_equals_run),
      cmocka_unit_test(test_tiny_resume_is_bit_exact),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
