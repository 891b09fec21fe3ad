// Which timed cuBLASLt choice a GEMM of M rows reuses (linear.cpp). Timing the candidates is worth it
// once per kind of problem, not once per row count: a server's mixed steps (decode rows plus prefill
// chunks) have a new M nearly every step, and each timing runs every candidate several times with
// the L2 flushed. So the choice is kept per row bucket: exact up to 8 rows (GEMV-sized, where the
// weights' streaming decides), multiples of 8 up to 64 and of 64 up to 512 (decode batches), powers
// of two beyond (prefill, compute-bound). Plain C++ so that the CPU tests check it.
#pragma once

namespace fdpp::cuda {

inline int tuning_rows(int m) {
  if (m <= 8) return m;
  if (m <= 64) return (m + 7) / 8 * 8;
  if (m <= 512) return (m + 63) / 64 * 64;
  int b = 1024;
  while (b < m && b < (1 << 30)) b *= 2;
  return b;
}

}  // namespace fdpp::cuda
