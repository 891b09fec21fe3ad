// Load-time repacking of GGUF blocks into interleaved row groups for the CPU's integer kernels.
//
// Why: a file-order kernel at M = 1 reads one activation block per weight block, unpacks a K-quant's
// scales once per row and reduces each row horizontally. With R rows interleaved per block, one
// 32-bit lane per row, an activation word broadcast once serves R rows (vpdpbusd / vpmaddubsw),
// the scales of R rows unpack in one vector and nothing is reduced horizontally. R = 8 for AVX2's
// 8 int32 lanes, 16 for AVX-512's (llama.cpp's repack uses the same idea; the layouts here are ours).
//
// A matrix of N rows becomes N / R groups followed by the N % R leftover rows in file format. A
// group is its blocks in K order; block b of a group holds the R rows' block b, the same bytes as
// the file (no padding, no extra scale tables: the packed copy is exactly as large as the file's):
//   Q4_0 (18 B/row)   d[R] fp16 | qs: for p < 4, r < R: the row's 4 bytes qs[4p .. 4p+3]
//                     (low nibbles are elements 4p.., high nibbles 16 + 4p..: the file's pairing)
//   Q4_1 (20 B/row)   d[R] fp16 | m[R] fp16 | qs as Q4_0's
//   Q8_0 (34 B/row)   d[R] fp16 | qs: for p < 8, r < R: the row's 4 bytes qs[4p .. 4p+3]
//   Q4_K (144 B/row)  d[R] | dmin[R] | scales: for word w < 3, r < R: bytes 4w..4w+3 of the row's 12
//                     | qs: for group j < 8, p < 4, r < R, i < 4: one byte, the low nibble element
//                     32j + 4p + i, the high nibble element 32j + 16 + 4p + i
//   Q5_K (176 B/row)  d[R] | dmin[R] | scales as Q4_K's | for group j < 8: its 4 nibble words as
//                     Q4_K's, then one word per row: bit p of byte i is the fifth bit of element
//                     32j + 4p + i, bit 4 + p of element 32j + 16 + 4p + i
//   Q6_K (210 B/row)  d[R] | scales: for group s < 16, r < R: the int8 scale | for j < 8: ql_j,
//                     group j of Q4_K's qs layout (the low 4 bits of the 6), then qh_j: for h < 2,
//                     r < R, i < 4: one byte whose bits 2p, 2p+1 are the high 2 bits of element
//                     32j + 16h + 4p + i. (One stream in order: with ql and qh in two separate
//                     regions, the kernel read DRAM 2x slower than the file-order one.)
#pragma once

#include <cstdint>

#include "io/gguf.h"
#include "model/decoder.h"

namespace fdpp::cpu {

// Whether `type` has an interleaved layout.
bool repack_supported(gguf::GgmlType type);

// Packs rows[0..R) (each cols elements of `type`, file format) into one group at dst
// (R * row_bytes bytes), and the inverse for row r of a group (dst: one file-format row).
void pack_group(gguf::GgmlType type, int R, const uint8_t* const* rows, int64_t cols, uint8_t* dst);
void unpack_group_row(gguf::GgmlType type, int R, const uint8_t* group, int r, int64_t cols, uint8_t* dst);

// A packed copy of m (its row_order applied) with R rows per group, in its own anonymous memory
// (transparent huge pages asked for). Returns m unchanged for a type without a layout or R <= 0.
// drop_source: m's bytes are a read-only file mapping whose pages are dropped as they are copied.
StoredMatrix repack_matrix(const StoredMatrix& m, int R, bool drop_source = false);

// Row n of a matrix in either form, in file format (out: row_bytes bytes).
void stored_row_bytes(const StoredMatrix& m, int64_t n, uint8_t* out);

// LoadOptions::prepare_stored for the CPU: repacks every projection and the output matrix for the
// best ISA's kernels; with `mapped`, drops each source's file pages from this process once copied,
// so that the file's copy and the packed one are never both resident.
void repack_weights(DecoderWeights& w, bool mapped);

}  // namespace fdpp::cpu
