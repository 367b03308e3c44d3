"""Tally's evaluation view of an image file, in Python: what `tally embed` and `tally eval` feed
the encoder, before normalization.

Tally decodes a file (src/data/decode.c), then makes one square view of `size` pixels from it
(src/data/dataset.c, dataset_eval_pixels; src/data/imagefolder.c for `data.stream = 0`):

crop="center"  (`data.stream = 1`, the default and the photo recipe's) the centred square of the
               short side, resized to size x size; the result stays float.
crop="squash"  (`data.stream = 0`) the whole image resized to size x size whatever its aspect,
               rounded to 8 bits (how it is held in memory).

A JPEG is decoded by libjpeg at 1/2, 1/4 or 1/8 of each side in the DCT when the square (or the
whole image, for "squash") still keeps at least `size` pixels a side; Pillow's `Image.draft()`
asks the same library for the same reduction. The resize is a triangle (bilinear) filter that
widens with the shrink factor (Pillow's BILINEAR does the same), taking pixels only from inside
the crop. PNG and BMP are decoded by stb_image, whose conversions (RGB to gray, 16 bits to 8)
are reproduced here. EXIF orientation is ignored, by Tally and here alike.
"""

import math
import os

import numpy as np
from PIL import Image

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp")
JPEG_EXTENSIONS = (".jpg", ".jpeg")
CROPS = ("center", "squash")


def reduced_side(side, reduction):
    """The side libjpeg's scaled decode gives: rounded up."""
    return (side + reduction - 1) // reduction


def reduction_for(h, w, need_h, need_w):
    """The largest JPEG reduction (1, 2, 4, 8) that still decodes h x w at least need_h x need_w
    (image_reduction_for in src/data/decode.c)."""
    r = 1
    while r < 8 and reduced_side(h, 2 * r) >= need_h and reduced_side(w, 2 * r) >= need_w:
        r *= 2
    return r


def is_jpeg(path):
    return os.path.splitext(path)[1].lower() in JPEG_EXTENSIONS


def image_size(path):
    """(h, w) of the file, from its header."""
    with Image.open(path) as im:
        return im.height, im.width


def _stb_gray(rgb):
    """stb_image's RGB -> luminance: (77 r + 150 g + 29 b) >> 8."""
    rgb = rgb.astype(np.uint32)
    return ((rgb[..., 0] * 77 + rgb[..., 1] * 150 + rgb[..., 2] * 29) >> 8).astype(np.uint8)


def _to_8bit(a):
    """16-bit samples to 8 as stb_image does (the high byte)."""
    if a.dtype == np.uint8:
        return a
    if a.dtype == bool:
        return a.astype(np.uint8) * 255
    return ((a.astype(np.int64) >> 8) & 0xFF).astype(np.uint8)


def _pixels(im, channels):
    """A loaded Pillow image -> uint8 (h, w, channels): gray replicated to RGB, alpha dropped,
    colour to gray with stb_image's weights (a JPEG arrives already in the mode asked for)."""
    mode = im.mode
    if mode in ("1", "L", "I", "I;16", "I;16B", "I;16L", "LA", "La"):
        gray = _to_8bit(np.asarray(im.convert("L") if mode in ("LA", "La") else im))
        if gray.ndim == 3:
            gray = gray[..., 0]
        return gray[..., None] if channels == 1 else np.repeat(gray[..., None], 3, axis=2)
    if mode not in ("RGB", "RGBA", "RGBX", "P", "PA"):
        raise ValueError(f"{im.filename}: {mode} images are not decoded by Tally")
    rgb = np.asarray(im.convert("RGB") if mode != "RGB" else im)
    return _stb_gray(rgb)[..., None] if channels == 1 else np.ascontiguousarray(rgb)


def decode(path, channels=3, reduction=1):
    """uint8 (h, w, channels) of an image file as Tally decodes it; a JPEG at 1/`reduction` of
    each side (1, 2, 4 or 8, rounded up), other formats at full size whatever `reduction` says."""
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if reduction not in (1, 2, 4, 8):
        raise ValueError(f"reduction must be 1, 2, 4 or 8, got {reduction}")
    ext = os.path.splitext(path)[1].lower()
    if ext not in IMAGE_EXTENSIONS:
        raise ValueError(f"{path}: not a .png, .jpg, .jpeg or .bmp file")
    with Image.open(path) as im:
        expected_format = {".png": "PNG", ".bmp": "BMP"}.get(ext, "JPEG")
        if im.format != expected_format:
            raise ValueError(f"{path}: its content is not the image format its name says")
        if ext in JPEG_EXTENSIONS:
            h, w = im.height, im.width
            # draft() picks the largest of 1/8, 1/4, 1/2 keeping at least the size asked for;
            # asking for floor(side / r) makes that r. Gray output is libjpeg's own (its Y).
            im.draft("L" if channels == 1 else "RGB",
                     (max(w // reduction, 1), max(h // reduction, 1)))
            want = (reduced_side(w, reduction), reduced_side(h, reduction))
            if im.size != want:
                raise RuntimeError(f"{path}: Pillow decoded {im.size}, Tally would {want}")
        im.load()
        return _pixels(im, channels)


def _axis_taps(out_len, crop_start, crop_len, length):
    """The taps of each output pixel along one axis, in float32 as axis_taps and tap_weight in
    src/data/dataset.c compute them: (lo (out_len,), weights (out_len, most taps), sums
    (out_len,)); output o reads pixels lo[o] + k with weights[o, k]."""
    f = np.float32
    crop_start, crop_len = f(crop_start), f(crop_len)
    scale = crop_len / f(out_len)
    half_width = scale if scale > f(1) else f(1)
    inv_half_width = f(1) / half_width
    # Clamped to the crop, not the image: the same as cropping, then resizing.
    first, end = math.floor(crop_start), math.ceil(crop_start + crop_len)
    rows = []
    for o in range(out_len):
        centre = crop_start + (f(o) + f(0.5)) * scale
        lo = max(int(math.floor(centre - half_width - f(0.5))) + 1, first, 0)
        hi = min(int(math.ceil(centre + half_width - f(0.5))), end, length)
        d = np.abs(np.arange(lo, hi).astype(f) + f(0.5) - centre) * inv_half_width
        w = np.where(d < f(1), f(1) - d, f(0)).astype(f)
        total = f(0)
        for v in w:  # summed in order, as the C loop does
            total = f(total + v)
        if not total > 0:  # a sliver of a pixel: its nearest pixel
            lo, w, total = min(int(centre), length - 1), np.ones(1, dtype=f), f(1)
        rows.append((lo, w, total))
    most = max(len(w) for _, w, _ in rows)
    lo = np.array([r[0] for r in rows])
    weights = np.zeros((out_len, most), dtype=f)
    for o, (_, w, _) in enumerate(rows):
        weights[o, :len(w)] = w
    return lo, weights, np.array([r[2] for r in rows], dtype=f)


def resample(pixels, y0, x0, crop_h, crop_w, out_h, out_w):
    """float32 (out_h, out_w, c) on 0..255: the box [y0, y0 + crop_h) x [x0, x0 + crop_w) of
    uint8 (h, w, c) pixels (fractional on a reduced decode) resized with Tally's filter, with
    its float32 arithmetic in its order (image_resample_box in src/data/dataset.c): rounding to 8
    bits afterwards ("squash") then gives the same bytes."""
    h, w = pixels.shape[:2]
    ylo, wy, sy = _axis_taps(out_h, y0, crop_h, h)
    xlo, wx, sx = _axis_taps(out_w, x0, crop_w, w)
    src = pixels.astype(np.float32)
    out = np.zeros((out_h, out_w, pixels.shape[2]), dtype=np.float32)
    # A tap past an output's last reads a clamped pixel with weight 0: adding 0 changes nothing.
    for k in range(wy.shape[1]):
        rows = src[np.minimum(ylo + k, h - 1)]                      # (out_h, w, c)
        for j in range(wx.shape[1]):
            cols = rows[:, np.minimum(xlo + j, w - 1)]               # (out_h, out_w, c)
            wxy = wy[:, k, None] * wx[None, :, j]                    # (out_h, out_w) float32
            out += wxy[..., None] * cols
    return out / (sy[:, None] * sx[None, :])[..., None]


def load_image(path, size, channels=3, crop="center"):
    """float32 (size, size, channels) on the 0..255 scale: Tally's evaluation view of the file
    before normalization (what `tally embed` encodes). crop: "center" for a run with
    `data.stream = 1` (the default), "squash" for `data.stream = 0`."""
    if crop not in CROPS:
        raise ValueError(f"crop must be one of {CROPS}, got {crop!r}")
    h, w = image_size(path)
    if crop == "center":
        side = min(h, w)
        y0, x0, box_h, box_w = (h - side) // 2, (w - side) // 2, side, side
    else:
        y0, x0, box_h, box_w = 0, 0, h, w
    r = reduction_for(box_h, box_w, size, size) if is_jpeg(path) else 1
    pixels = decode(path, channels, r)
    f = np.float32
    if crop == "squash":
        # The whole decode, whatever its rounded-up sides; held in memory as 8 bits, rounded
        # as (uint8_t)(v + 0.5f) (src/data/imagefolder.c, load_image).
        view = resample(pixels, f(0), f(0), f(pixels.shape[0]), f(pixels.shape[1]), size, size)
        return np.floor(np.clip(view + f(0.5), 0, 255)).astype(np.float32)
    # A reduced decode's pixel i covers the source's [i r, (i + 1) r): the box scales by 1/r
    # (image_crop_resize in src/data/dataset.c).
    by0, bx0, bh, bw = f(y0) / f(r), f(x0) / f(r), f(box_h) / f(r), f(box_w) / f(r)
    bh = min(bh, f(pixels.shape[0]) - by0)
    bw = min(bw, f(pixels.shape[1]) - bx0)
    return resample(pixels, by0, bx0, bh, bw, size, size)


def load_images(paths, size, channels=3, crop="center"):
    """float32 (N, size, size, channels) on 0..255, one load_image per path."""
    return np.stack([load_image(p, size, channels, crop) for p in paths])


def list_images(folder):
    """The image files of an ImageFolder in Tally's order, the order of `tally embed`'s rows
    (its FILE.rows.txt lists them): class subfolders sorted by name, each one's images sorted;
    or, with no subfolders, the folder's images sorted. Hidden entries are skipped."""
    def entries(d):
        return sorted(e for e in os.listdir(d) if not e.startswith("."))

    classes = [e for e in entries(folder) if os.path.isdir(os.path.join(folder, e))]
    dirs = [os.path.join(folder, c) for c in classes] or [folder]
    return [os.path.join(d, e) for d in dirs for e in entries(d)
            if os.path.splitext(e)[1].lower() in IMAGE_EXTENSIONS
            and not os.path.isdir(os.path.join(d, e))]
