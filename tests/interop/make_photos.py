#!/usr/bin/python3
"""Writes a folder of test photos: JPEGs and PNGs/BMPs of sizes that exercise every decode and
crop path of Tally's evaluation view (landscape and portrait, odd sides, JPEG reductions 1/1 to
1/8 for a 64-pixel view, 4:2:0 and 4:4:4 chroma, progressive, grayscale, palette, alpha).

    /usr/bin/python3 tests/interop/make_photos.py OUT_DIR

The pictures are smooth gradients, discs and edges with a little noise (something a JPEG's DCT
and a resize both have to get right), the same bytes on every run of the same Pillow.
"""

import os
import sys

import numpy as np
from PIL import Image

sys.dont_write_bytecode = True


def picture(h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.empty((h, w, 3))
    for c in range(3):
        fy, fx, phase = rng.uniform(0.5, 4, 2).tolist() + [rng.uniform(0, 6.3)]
        img[..., c] = 128 + 90 * np.sin(2 * np.pi * (fy * y / h + fx * x / w) + phase)
    for _ in range(4):  # discs with hard edges
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(0.05, 0.3) * min(h, w)
        inside = (y - cy) ** 2 + (x - cx) ** 2 < r * r
        img[inside] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


# name, height, width, how it is saved
PHOTOS = [
    ("a-landscape.jpg", 150, 200, dict(quality=90)),            # square 150: 1/2 for 64 px
    ("b-portrait.jpg", 211, 157, dict(quality=85)),             # odd sides, 1/2
    ("c-small.jpg", 97, 131, dict(quality=90)),                 # 1/1
    ("d-camera.jpg", 480, 640, dict(quality=92)),               # 1/4
    ("e-large.jpg", 768, 1030, dict(quality=80, subsampling=2, progressive=True)),  # 1/8
    ("f-444.jpeg", 300, 257, dict(quality=95, subsampling=0)),  # 4:4:4, 1/4 of the square
    ("g-gray.jpg", 260, 190, dict(quality=90, gray=True)),      # a one-channel JPEG
    ("h-rgb.png", 120, 90, dict()),
    ("i-palette.png", 77, 101, dict(palette=True)),
    ("j-alpha.png", 64, 80, dict(alpha=True)),
    ("k-bitmap.bmp", 70, 70, dict()),
    ("l-exact.png", 64, 64, dict()),                            # already the view's size
]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for seed, (name, h, w, how) in enumerate(PHOTOS):
        how = dict(how)
        im = Image.fromarray(picture(h, w, seed))
        if how.pop("gray", False):
            im = im.convert("L")
        if how.pop("palette", False):
            im = im.convert("P", palette=Image.ADAPTIVE, colors=64)
        if how.pop("alpha", False):
            im.putalpha(Image.fromarray(picture(h, w, 99)[..., 0]))
        im.save(os.path.join(out, name), **how)


if __name__ == "__main__":
    main()
