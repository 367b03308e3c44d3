// `tally embed`: a trained encoder's features of a dataset as an (N, D) float32 .npy, with the
// labels beside it when the dataset has them and which image each row is.
#pragma once

// Encodes every image of `data` (an IDX images file, an ImageFolder root, or a folder of images;
// its first `limit` when > 0, as data.limit takes them) with the encoder in `src` (a run folder,
// a checkpoint or an export) under its evaluation transform, and writes `out`, OUT.labels.npy
// (int64, when `data` has labels) and OUT.rows.txt (each row's image, one line a row), OUT being
// `out` without its .npy. Every output is checked before anything is written. Progress lines go
// to stdout. Returns 0, or -1 with tl_last_error() set.
int embed_write(const char *src, const char *data, int limit, const char *out);
