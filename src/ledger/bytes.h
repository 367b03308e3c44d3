// Byte counts for people: "1.50 GiB", "512 MiB", "0 B" (binary units, 3 significant digits).
#pragma once
#include <stddef.h>

void format_bytes(double bytes, char *buf, size_t n);
