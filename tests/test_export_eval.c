// Encoders that leave a run: `tally export` writes PyTorch's names and layouts (checked here on
// the file; tests/test_torch_roundtrip.sh loads it in PyTorch), `--init` reads an export back
// into Tally's layout exactly, `tally embed` writes .npy files numpy reads, and `tally eval`
// scores an encoder next to raw pixels. Unlabeled image folders train with kNN off.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cli_test_util.h"
#include "core/error.h"
#include <stb_image_write.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *small =
    "--steps 3 --set data.limit=512 --set data.test_limit=300 --set train.batch_size=64 "
    "--no-knn --quiet";

static int tally(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int tally(const char *fmt, ...) {
  char args[3000];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  return sh("%s %s > %s/last.log 2>&1", bin, args, tmpdir);
}

static StFile read_st(const char *fmt, const char *name) {
  char path[600];
  snprintf(path, sizeof path, fmt, tmpdir, name);
  StFile f;
  if (st_read(&f, path, 0) != 0) fail_msg("%s", tl_last_error());
  return f;
}

static void expect_shape(const StFile *f, const char *name, int ndim, const int64_t *shape) {
  const StTensor *t = st_find(f, name);
  if (!t) fail_msg("no tensor %s", name);
  assert_int_equal(t->ndim, ndim);
  for (int d = 0; d < ndim; d++) assert_int_equal(t->shape[d], shape[d]);
}

// ResNet: torchvision's names (conv1, bn1, layerS.B, downsample.0/1), Conv2d (O, I, kh, kw),
// BatchNorm with num_batches_tracked = steps trained; the head only with --with-head.
static void test_export_resnet_names_and_layouts(void **state) {
  (void)state;
  assert_int_equal(tally("train --objective=inbatch %s --out %s/rn", small, tmpdir), 0);
  assert_int_equal(tally("export %s/rn", tmpdir), 0);
  StFile f = read_st("%s/%s/encoder.safetensors", "rn");
  expect_shape(&f, "conv1.weight", 4, (int64_t[]){32, 1, 3, 3});
  expect_shape(&f, "layer2.0.downsample.0.weight", 4, (int64_t[]){64, 32, 1, 1});
  expect_shape(&f, "bn1.weight", 1, (int64_t[]){32});
  expect_shape(&f, "bn1.running_var", 1, (int64_t[]){32});
  const StTensor *nbt = st_find(&f, "bn1.num_batches_tracked");
  assert_non_null(nbt);
  assert_int_equal(nbt->dtype, ST_I64);
  assert_int_equal(nbt->ndim, 0);
  int64_t batches;
  memcpy(&batches, nbt->data, sizeof batches);
  assert_int_equal(batches, 3);
  assert_null(st_find(&f, "bn1.gamma"));
  assert_null(st_find(&f, "stem.conv.weight"));
  assert_null(st_find(&f, "head.fc1.weight"));
  assert_non_null(st_get_meta(&f, "input_mean"));
  assert_non_null(st_get_meta(&f, "config"));
  st_free(&f);
  assert_int_equal(tally("export %s/rn --with-head --out %s/rn/full.safetensors", tmpdir, tmpdir),
                   0);
  f = read_st("%s/%s/full.safetensors", "rn");
  expect_shape(&f, "head.fc1.weight", 2, (int64_t[]){256, 128});
  expect_shape(&f, "head.bn.running_mean", 1, (int64_t[]){256});
  st_free(&f);
  // An export of format tally-export-1 named a ResNet's tensors as Tally does (stem.conv.weight,
  // stage1.block1.conv1.weight, ...): it is still read.
  assert_int_equal(tally("embed tests/fuzz/corpus/safetensors/export-resnet --data "
                         "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz --limit 4 "
                         "--out %s/old.npy",
                         tmpdir),
                   0);
}

// ViT: the patch embedding becomes a Conv2d weight (D, C, P, P) — a real transpose when C > 1 —
// and --init from the export puts back exactly the bytes the run trained.
static void test_export_vit_and_init_round_trip(void **state) {
  (void)state;
  assert_int_equal(tally("train --objective=mae %s --out %s/vit", small, tmpdir), 0);
  assert_int_equal(tally("export %s/vit", tmpdir), 0);
  StFile ex = read_st("%s/%s/encoder.safetensors", "vit");
  expect_shape(&ex, "patch_embed.proj.weight", 4, (int64_t[]){128, 1, 4, 4});
  expect_shape(&ex, "cls_token", 3, (int64_t[]){1, 1, 128});
  expect_shape(&ex, "blocks.0.attn.qkv.weight", 2, (int64_t[]){384, 128});
  expect_shape(&ex, "norm.weight", 1, (int64_t[]){128});
  st_free(&ex);
  // A fresh run from the export, stopped after one step at learning rate 0: its encoder is the
  // exported one, byte for byte (the decoder starts anew).
  assert_int_equal(tally("train --objective=mae %s --set optim.lr=0 --set optim.weight_decay=0 "
                         "--init %s/vit/encoder.safetensors --out %s/vit-init",
                         small, tmpdir, tmpdir),
                   0);
  StFile a = read_st("%s/%s/checkpoint.safetensors", "vit");
  StFile b = read_st("%s/%s/checkpoint.safetensors", "vit-init");
  int compared = 0;
  for (int i = 0; i < a.n_tensors; i++) {
    const StTensor *t = &a.tensors[i];
    if (strncmp(t->name, "params.", 7) || !strncmp(t->name, "params.decoder.", 15)) continue;
    const StTensor *u = st_find(&b, t->name);
    assert_non_null(u);
    assert_int_equal(u->bytes, t->bytes);
    if (memcmp(u->data, t->data, t->bytes)) fail_msg("%s differs after --init", t->name);
    compared++;
  }
  assert_true(compared > 40);
  st_free(&a);
  st_free(&b);
  // The ResNet export does not fit the ViT: refused, naming the first missing tensor.
  assert_int_equal(tally("train --objective=mae %s --init %s/rn/encoder.safetensors --out %s/bad",
                         small, tmpdir, tmpdir),
                   1);
  assert_int_equal(sh("grep -q 'has no tensor for patch_embed.weight' %s/last.log", tmpdir), 0);
}

// embed: (N, D) float32 and (N,) int64 .npy files with the right headers and sizes.
static void test_embed_writes_npy(void **state) {
  (void)state;
  assert_int_equal(tally("embed %s/rn --data /usr/share/datasets/fashion-mnist/"
                         "t10k-images-idx3-ubyte.gz --limit 50 --out %s/e.npy",
                         tmpdir, tmpdir),
                   0);
  char path[600], head[129] = {0};
  snprintf(path, sizeof path, "%s/e.npy", tmpdir);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  assert_int_equal(fread(head, 1, 128, f), 128);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  assert_memory_equal(head, "\x93NUMPY\x01\x00", 8);
  int header_len = (unsigned char)head[8] | (unsigned char)head[9] << 8;
  assert_int_equal((10 + header_len) % 64, 0);
  assert_non_null(strstr(head + 10, "'descr': '<f4'"));
  assert_non_null(strstr(head + 10, "'shape': (50, 128)"));
  assert_int_equal(size, 10 + header_len + 50 * 128 * 4);
  assert_int_equal(sh("grep -q \"'shape': (50,)\" %s/e.labels.npy", tmpdir), 0);
}

static double json_field(const char *text, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "\"%s\": ", name);
  const char *p = strstr(text, key);
  if (!p) fail_msg("no %s in %s", name, text);
  return strtod(p + strlen(key), NULL);
}

// eval --json: every field the issue names, accuracies of a plausible size: on 512 training and
// 300 test images raw pixels score well above chance (0.1), and so does a 3-step encoder.
static void test_eval_json(void **state) {
  (void)state;
  assert_int_equal(tally("eval %s/rn --json", tmpdir), 0);
  char path[600], text[4096];
  snprintf(path, sizeof path, "%s/last.log", tmpdir);
  read_file_text(path, text, sizeof text);
  assert_int_equal(json_field(text, "n_train"), 512);
  assert_int_equal(json_field(text, "n_test"), 300);
  const char *acc[] = {"knn_top1", "knn_top1_k20", "linear_top1", "knn_top1_raw_pixels",
                       "linear_top1_raw_pixels"};
  const double above[] = {0.2, 0.2, 0.2, 0.6, 0.6};
  for (int i = 0; i < 5; i++) {
    double v = json_field(text, acc[i]);
    if (!(v > above[i] && v <= 1)) fail_msg("%s = %g", acc[i], v);
  }
  assert_true(json_field(text, "seconds") > 0);
  // The label-free measures: a trained encoder uses more than one direction and is spread.
  const double rankme = json_field(text, "rankme"), spread = json_field(text, "embedding_std");
  if (!(rankme > 1.5 && rankme <= json_field(text, "feature_dim"))) fail_msg("rankme = %g", rankme);
  if (!(spread > 0 && spread < 1)) fail_msg("embedding_std = %g", spread);

  // Without the baseline: the encoder's measures as before, the raw pixels' null.
  assert_int_equal(tally("eval %s/rn --json --no-baseline", tmpdir), 0);
  read_file_text(path, text, sizeof text);
  assert_non_null(strstr(text, "\"knn_top1_raw_pixels\": null"));
  assert_non_null(strstr(text, "\"linear_top1_raw_pixels\": null"));
  double knn = json_field(text, "knn_top1");
  if (!(knn > 0.2 && knn <= 1)) fail_msg("knn_top1 = %g without the baseline", knn);
}

// Writes root/<class>/NN.png for each class, stripes whose direction depends on the class.
static void write_folder(const char *root, const char *const *classes, int n_classes) {
  char cls[400], path[500];
  mkdir(root, 0755);
  unsigned char img[16 * 16];
  for (int c = 0; c < n_classes; c++) {
    snprintf(cls, sizeof cls, "%s/%s", root, classes[c]);
    mkdir(cls, 0755);
    for (int k = 0; k < 8; k++) {
      for (int i = 0; i < 16 * 16; i++)
        img[i] = (unsigned char)((((c % 2 ? i % 16 : i / 16) + k) / 2 % 2) ? 220 : 30);
      snprintf(path, sizeof path, "%s/%02d.png", cls, k);
      assert_true(stbi_write_png(path, 16, 16, 1, img, 16));
    }
  }
}

// Test classes are matched to training classes by name; one the training set lacks is an error
// naming it, not a silently wrong score.
static void test_eval_matches_classes_by_name(void **state) {
  (void)state;
  char train[300], test_ok[300], test_bad[300];
  snprintf(train, sizeof train, "%s/cats-dogs", tmpdir);
  snprintf(test_ok, sizeof test_ok, "%s/dogs", tmpdir);
  snprintf(test_bad, sizeof test_bad, "%s/cats-zebras", tmpdir);
  write_folder(train, (const char *[]){"cat", "dog"}, 2);
  write_folder(test_ok, (const char *[]){"dog"}, 1);
  write_folder(test_bad, (const char *[]){"cat", "zebra"}, 2);
  assert_int_equal(tally("train --objective=inbatch --steps 2 --set data.format=imagefolder "
                         "--set data.image_size=16 --set train.batch_size=8 --set "
                         "data.train=%s --set data.test=%s --no-knn --quiet --out %s/cd",
                         train, train, tmpdir),
                   0);
  // "dog" is the training set's class 1: a subset test set scores against the right class.
  assert_int_equal(tally("eval %s/cd --knn --set data.test=%s --set eval.knn_k=4", tmpdir, test_ok),
                   0);
  assert_int_equal(tally("eval %s/cd --knn --set data.test=%s", tmpdir, test_bad), 1);
  assert_int_equal(sh("grep -q \"class 'zebra' is not among\" %s/last.log", tmpdir), 0);
  // The training monitor checks the same before the first step.
  assert_int_equal(tally("train --objective=inbatch --steps 2 --set data.format=imagefolder "
                         "--set data.image_size=16 --set train.batch_size=8 --set "
                         "data.train=%s --set data.test=%s --quiet --out %s/cz",
                         train, test_bad, tmpdir),
                   1);
  assert_int_equal(sh("grep -q \"class 'zebra' is not among\" %s/last.log", tmpdir), 0);
}

// Unlabeled data: a folder of images with no class subfolders trains with data.labels = none
// (no kNN, no test set needed; the label-free quality of its streamed images still measured); with
// the default it is refused with the setting to use.
static void test_unlabeled_folder(void **state) {
  (void)state;
  char root[300], path[400];
  snprintf(root, sizeof root, "%s/unlabeled", tmpdir);
  mkdir(root, 0755);
  unsigned char img[20 * 20];
  for (int k = 0; k < 24; k++) {
    for (int i = 0; i < 20 * 20; i++) img[i] = (unsigned char)((i * (k + 3)) % 251);
    snprintf(path, sizeof path, "%s/img%02d.png", root, k);
    assert_true(stbi_write_png(path, 20, 20, 1, img, 20));
  }
  const char *args =
      "train --objective=inbatch --steps 2 --set data.format=imagefolder "
      "--set data.image_size=16 --set train.batch_size=8 --quiet";
  assert_int_equal(
      tally("%s --set data.train=%s --set data.test=/nonexistent --out %s/u1", args, root, tmpdir),
      1);
  assert_int_equal(sh("grep -q 'data.labels = none' %s/last.log", tmpdir), 0);
  assert_int_equal(tally("%s --set data.train=%s --set data.test=/nonexistent "
                         "--set data.labels=none --out %s/u2",
                         args, root, tmpdir),
                   0);
  assert_int_equal(sh("grep -q '\"knn_top1\": null' %s/u2/summary.json", tmpdir), 0);
  assert_int_equal(sh("grep -q '\"rankme\": [0-9]' %s/u2/summary.json", tmpdir), 0);
}

int main(void) {
  if (cli_test_init("export") != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_export_resnet_names_and_layouts),
      cmocka_unit_test(test_export_vit_and_init_round_trip),
      cmocka_unit_test(test_embed_writes_npy),
      cmocka_unit_test(test_eval_json),
      cmocka_unit_test(test_eval_matches_classes_by_name),
      cmocka_unit_test(test_unlabeled_folder),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (!failed) sh("rm -rf %s", tmpdir);
  return failed;
}
