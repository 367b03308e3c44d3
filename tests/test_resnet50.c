// ResNet-50's parts (models/resnet50.ini, models/resnet18.ini): the bottleneck block and the
// ImageNet stem (7x7 stride-2 convolution, 3x3 stride-2 max-pool) against finite differences on a
// tiny network of their shape; the shipped model files' parameter counts against torchvision's
// published totals; the export's names against torchvision's module tree, written out here; and,
// through the binary, a tiny ResNet-50-shaped model (3, 4, 6, 3 bottleneck blocks at widths 4 to
// 32) planned as it runs and resumed bit for bit.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "core/counting.h"
#include "gradcheck.h"
#include "objective_test_util.h"
#include "encoder/export.h"

// ---- the blocks, in process ----

enum { GRAD_N = 2, GRAD_S = 16, GRAD_C = 3 };

typedef struct {
  ExecCtx ctx;
  ParamSet ps;
  Backbone *bb;
  float images[GRAD_N * GRAD_S * GRAD_S * GRAD_C];
  float *R;
} GradCase;

static double feature_loss(void *arg) {
  GradCase *c = arg;
  c->bb->forward(c->bb, &c->ctx, c->images);
  double s = 0;
  for (int i = 0; i < GRAD_N * c->bb->feature_dim; i++) s += (double)c->bb->feature[i] * c->R[i];
  return s;
}

// stem 4 channels, 7x7 stride 2 (16 -> 8), max-pool (8 -> 4); bottleneck stages of width 2 (out 8,
// a projection for the channels) and width 4 at stride 2 (out 16, 4 -> 2).
static ModelSpec tiny_bottleneck_spec(void) {
  ModelSpec m = tiny_model_spec("resnet");
  snprintf(m.stem, sizeof m.stem, "imagenet");
  snprintf(m.block, sizeof m.block, "bottleneck");
  m.stem_channels = 4;
  m.stage_channels[0] = 2;
  m.stage_channels[1] = 4;
  return m;
}

// Every parameter tensor's gradient, sampled, against central differences. With ReLUs and a
// max-pool every activation is a kink a quotient can straddle: as test_objectives' ResNet check,
// 5% of max(|g|, 1e-2), where a wiring error is off by O(1).
static void test_bottleneck_and_imagenet_stem_gradient(void **state) {
  (void)state;
  GradCase *c = calloc(1, sizeof *c);
  const ModelSpec spec = tiny_bottleneck_spec();
  exec_ctx_init(&c->ctx);
  paramset_alloc(&c->ps, backbone_param_count(&spec, GRAD_S, GRAD_C), 3);
  Builder b = {.ctx = &c->ctx, .params = &c->ps, .mode = OP_TRAIN};
  c->bb = backbone_create(&spec, &b, GRAD_N, GRAD_S, GRAD_C);
  assert_int_equal(c->bb->feature_dim, 16);  // 4 x the last width
  assert_int_equal(backbone_feature_dim(&spec), 16);
  assert_int_equal(c->ps.used, c->ps.count);
  c->R = calloc((size_t)GRAD_N * c->bb->feature_dim, sizeof *c->R);
  Rng r = rng_stream(11, RNG_TEST, 0, 0);
  for (size_t i = 0; i < sizeof c->images / sizeof c->images[0]; i++) c->images[i] = rng_normal(&r);
  for (int i = 0; i < GRAD_N * c->bb->feature_dim; i++) c->R[i] = rng_normal(&r);
  paramset_zero_grad(&c->ps, 0);
  feature_loss(c);
  c->bb->backward(c->bb, &c->ctx, c->R);
  float *analytic = malloc(sizeof(float) * c->ps.count);
  memcpy(analytic, c->ps.grad, sizeof(float) * c->ps.count);
  int checked = 0;
  for (int e = 0; e < c->ps.n_entries; e++) {
    const ParamEntry *pe = &c->ps.entries[e];
    if (pe->is_buffer) continue;
    double err = gradcheck(feature_loss, c, c->ps.data + pe->offset, analytic + pe->offset,
                           pe->count, 8, 1e-3f, 1e-2, pe->name);
    assert_true(err < 5e-2);
    checked++;
  }
  // The stem's conv and BatchNorm (gamma, beta); 2 blocks of 3 of each and a projection's.
  assert_int_equal(checked, 3 + 2 * (3 * 3 + 3));
  free(analytic);
  free(c->R);
  c->bb->destroy(c->bb);
  paramset_free(&c->ps);
  exec_ctx_destroy(&c->ctx);
  free(c);
}

// ---- the shipped model files ----

// torchvision's totals (torchvision.models.resnet50: 25,557,032 parameters; resnet18: 11,689,512)
// less fc (2048 or 512 inputs x 1000 classes + 1000 biases), plus what Tally also counts that
// torchvision keeps as buffers: each BatchNorm's running mean and variance.
static long bn_channels(int bottleneck, const int *blocks) {
  const int widths[] = {64, 128, 256, 512};
  long c = 64;  // bn1
  int in = 64;
  for (int s = 0; s < 4; s++)
    for (int b = 0; b < blocks[s]; b++) {
      const int w = widths[s], out = bottleneck ? 4 * w : w;
      c += bottleneck ? w + w + out : w + w;
      if (b == 0 && (s > 0 || in != out)) c += out;  // downsample.1
      in = out;
    }
  return c;
}

static void expect_model_count(const char *file, long torchvision_total, int fc_in, int bottleneck,
                               const int *blocks) {
  Config cfg;
  config_defaults(&cfg);
  if (config_load_model(&cfg, file) != 0) fail_msg("%s", tl_last_error());
  cfg.data.image_size = 224;
  cfg.data.channels = 3;
  if (config_validate(&cfg) != 0) fail_msg("%s", tl_last_error());
  const long want =
      torchvision_total - (fc_in * 1000L + 1000) + 2 * bn_channels(bottleneck, blocks);
  const size_t got = backbone_param_count(&cfg.model.spec, 224, 3);
  print_message("%s: %zu parameters and BatchNorm statistics\n", file, got);
  assert_int_equal(got, want);
  assert_int_equal(backbone_feature_dim(&cfg.model.spec), fc_in);
}

static void test_model_files_count_as_torchvision(void **state) {
  (void)state;
  expect_model_count("models/resnet50.ini", 25557032, 2048, 1, (const int[]){3, 4, 6, 3});
  expect_model_count("models/resnet18.ini", 11689512, 512, 0, (const int[]){2, 2, 2, 2});
}

// torchvision's ResNet module tree for 4 stages of `blocks`, in state_dict order (fc left out):
// conv1, bn1, then each layer's blocks with conv1, bn1, conv2, bn2[, conv3, bn3][, downsample].
static int torchvision_names(int bottleneck, const int *blocks, char names[][64], int cap) {
  const char *bn[] = {"weight", "bias", "running_mean", "running_var"};
  int n = 0;
#define NAME(...) (n < cap ? snprintf(names[n++], 64, __VA_ARGS__) : 0)
  NAME("conv1.weight");
  for (int m = 0; m < 4; m++) NAME("bn1.%s", bn[m]);
  for (int s = 1; s <= 4; s++)
    for (int b = 0; b < blocks[s - 1]; b++) {
      for (int k = 1; k <= (bottleneck ? 3 : 2); k++) {
        NAME("layer%d.%d.conv%d.weight", s, b, k);
        for (int m = 0; m < 4; m++) NAME("layer%d.%d.bn%d.%s", s, b, k, bn[m]);
      }
      if (b == 0 && (s > 1 || bottleneck)) {
        NAME("layer%d.%d.downsample.0.weight", s, b);
        for (int m = 0; m < 4; m++) NAME("layer%d.%d.downsample.1.%s", s, b, bn[m]);
      }
    }
#undef NAME
  return n;
}

static void expect_export_names(const char *file, int bottleneck, const int *blocks) {
  Config cfg;
  config_defaults(&cfg);
  if (config_load_model(&cfg, file) != 0) fail_msg("%s", tl_last_error());
  CountingPass pass;
  counting_begin(&pass, 0);
  Builder b = {.ctx = &pass.ctx, .params = &pass.ps, .mode = OP_INFER};
  Backbone *bb = backbone_create(&cfg.model.spec, &b, 2, 224, 3);
  bb->destroy(bb);
  static char want[400][64];
  const int n = torchvision_names(bottleneck, blocks, want, 400);
  assert_int_equal(pass.ps.n_entries, n);
  for (int i = 0; i < n; i++) {
    const TorchTensor t = torch_tensor_for(&pass.ps.entries[i], &cfg.model.spec, 3);
    if (strcmp(t.name, want[i]) != 0)
      fail_msg("%s: %s exports as %s, torchvision's is %s", file, pass.ps.entries[i].name, t.name,
               want[i]);
  }
  counting_end(&pass);
}

static void test_export_names_are_torchvision(void **state) {
  (void)state;
  expect_export_names("models/resnet50.ini", 1, (const int[]){3, 4, 6, 3});
  expect_export_names("models/resnet18.ini", 0, (const int[]){2, 2, 2, 2});
}

// ---- through the binary: a tiny ResNet-50 ----

static char tiny50[600], tiny50_args[1024];

static void write_tiny50(void) {
  snprintf(tiny50, sizeof tiny50, "%s/tiny50.ini", tmpdir);
  FILE *f = fopen(tiny50, "w");
  assert_non_null(f);
  fprintf(f,
          "[backbone]\ntype = resnet\nstem = imagenet\nblock = bottleneck\nstem_channels = 16\n"
          "stage_channels = 4,8,16,32\nstage_blocks = 3,4,6,3\nstage_strides = 1,2,2,2\n");
  fclose(f);
  snprintf(tiny50_args, sizeof tiny50_args,
           "--objective=inbatch --set model.file=%s --set train.batch_size=32 --set "
           "data.limit=256 --set data.test_limit=128",
           tiny50);
}

static void test_tiny50_plan_equals_run(void **state) {
  (void)state;
  plan_equals_run("tiny50-plan", tiny50_args, "");
}

static void test_tiny50_resume_is_bit_exact(void **state) {
  (void)state;
  expect_stop_and_resume_bit_exact(tiny50_args, NULL);
}

int main(void) {
  objective_register_config();
  if (cli_test_init("resnet50") != 0) return 1;
  write_tiny50();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bottleneck_and_imagenet_stem_gradient),
      cmocka_unit_test(test_model_files_count_as_torchvision),
      cmocka_unit_test(test_export_names_are_torchvision),
      cmocka_unit_test(test_tiny50_plan_equals_run),
      cmocka_unit_test(test_tiny50_resume_is_bit_exact),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
