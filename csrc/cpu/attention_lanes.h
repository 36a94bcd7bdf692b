#pragma once
// Chunked-prefill attention tiles with the (query, head) rows in the vector lanes
// (attention.cpp hands them out and drives them key tile by key tile).
//
// An item with at least kLanesMinRows rows per KV head runs each key tile as two register-blocked
// GEMMs with its (query, head) rows in the vector lanes: S^T = K Q^T, then O^T += V^T P^T. With
// rows in lanes the online softmax is vertical (a row's max and sum over the tile are lane-wise
// max and add across the tile's score vectors), and both products broadcast one element of K or
// V against vectors of Q^T or P^T, so nothing is summed across lanes. Q^T and O^T are built and
// taken apart once per item; each key tile is copied dense once and shared by all of the rows.
// With AVX512-BF16 and bfloat16 data both products are bf16 dot products (pairs of head dims for
// S, pairs of keys for O, so P is rounded to bfloat16), accumulated in float32.

#include <cstdint>
#include <limits>

#include "cpu/vec.h"

namespace gnomon::cpu {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kLanesMinRows = 16;
constexpr int64_t kLanesKeys = 64;  // keys per tile: each tile reads and writes O^T once

// One KV head's share of a lanes item: `lanes` rows padded to whole vectors (padding rows see no
// key), their transposed query, output and softmax state, and the current key tile, dense.
struct LanesHead {
  int64_t lanes;
  int64_t ld;        // floats between the rows of qt, ot and the tile's scores and p_pairs
  float* qt;         // [D][ld] floats, or [D/2][ld] bf16 pairs (dot path)
  float* ot;         // [D][ld]
  float* max;        // [lanes]
  float* sum;        // [lanes]
};

struct LanesTile {
  const void* keys;    // [kLanesKeys][D] float32, or bf16 (dot path)
  const void* values;  // [kLanesKeys][D] float32, or [kLanesKeys / 2][D] bf16 key pairs (dot path),
                       // or [D][kLanesKeys / 2] (AMX)
  float* scores;       // [kLanesKeys][ld]: S^T, then P^T
  uint32_t* p_pairs;   // [kLanesKeys / 2][ld] (dot path)
  float* alpha;        // [lanes]: this tile's rescale of each row's output
  const int32_t* lo;   // [lanes]
  const int32_t* hi;
  int64_t n, d;
  float scale;
  bool masked;  // some row sees only part of the tile's keys
};

// One key tile of one KV head on the kernel family `isa`: the scores, the online softmax and the
// update of O^T. On the bf16 dot path (`dot`; `amx_dot`: AMX tiles, head dims a multiple of 32)
// tile.values holds the value rows as pair_values wrote them; otherwise as float32 rows.
void run_lanes_tile(Isa isa, bool amx_dot, bool dot, const LanesHead& head,
                    const LanesTile& tile);

// A tile's n value rows (bf16, d each, read through `rows`) paired by keys as the bf16 dot path
// of `isa` reads them: [d][kLanesKeys / 2] words on AMX (amx_dot), [(n + 1) / 2][d] otherwise.
void pair_values(Isa isa, bool amx_dot, const uint16_t* const* rows, int64_t n, int64_t d,
                 void* out);

}  // namespace gnomon::cpu
