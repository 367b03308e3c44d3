// bf16 numbers as oneDNN stores them: the upper 16 bits of an IEEE f32. For the few places C code
// reads or writes an activation a network keeps in bf16 (sync_bn's backward, tests).
#pragma once
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

// Rounded to nearest, ties to even, as oneDNN converts (NaN stays NaN: a quiet bit is set).
static inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

// Element i of a buffer of f32 or (bf16 = 1) bf16 values.
static inline float act_get(const void *buf, size_t i, int bf16) {
  return bf16 ? bf16_to_f32(((const uint16_t *)buf)[i]) : ((const float *)buf)[i];
}
static inline void act_set(void *buf, size_t i, int bf16, float v) {
  if (bf16)
    ((uint16_t *)buf)[i] = f32_to_bf16(v);
  else
    ((float *)buf)[i] = v;
}
