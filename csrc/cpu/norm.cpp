// rms_norm and rotary_embedding.
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "cpu/kernels.h"
#include "cpu/vec.h"

namespace gnomon::cpu {
namespace {

char* row_ptr(const TensorView& t, int64_t row) {
  return static_cast<char*>(t.data) + row * t.size(1) * dtype_size(t.dtype);
}

}  // namespace

void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, double eps,
              const TensorView* residual) {
  const int64_t rows = x.size(0), hidden = x.size(1);
  std::vector<float> w(hidden);
  load_floats(weight.data, weight.dtype, w.data(), hidden);
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(hidden, 1)),
               [&](int64_t begin, int64_t end) {
    std::vector<float> row(hidden), other(hidden);
    for (int64_t r = begin; r < end; ++r) {
      load_floats(row_ptr(x, r), x.dtype, row.data(), hidden);
      if (residual != nullptr) {
        // The residual stream keeps x + residual rounded to its dtype, and that rounded sum is
        // what gets normalised, so the two outputs agree exactly.
        load_floats(row_ptr(*residual, r), residual->dtype, other.data(), hidden);
        axpy(1.0f, other.data(), row.data(), hidden);
        store_floats(row.data(), residual->dtype, row_ptr(*residual, r), hidden);
        load_floats(row_ptr(*residual, r), residual->dtype, row.data(), hidden);
      }
      const float mean_square = hidden > 0 ? sum_squares(row.data(), hidden) / hidden : 0.0f;
      const float inv_rms = 1.0f / std::sqrt(mean_square + static_cast<float>(eps));
      scale_by(inv_rms, w.data(), row.data(), hidden);
      store_floats(row.data(), out.dtype, row_ptr(out, r), hidden);
    }
  });
}

void rotary_embedding(const TensorView& positions, const TensorView& query, const TensorView& key,
                      const TensorView& cos_sin_cache, bool is_neox) {
  const int64_t tokens = query.size(0), head_dim = query.size(2);
  const int64_t half = cos_sin_cache.size(1) / 2;
  const int64_t q_heads = query.size(1), k_heads = key.size(1);
  const int64_t elem = dtype_size(query.dtype);
  parallel_for(tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> head(head_dim);
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = cos_sin_cache.ptr<const float>() +
                         positions.ptr<const int64_t>()[t] * cos_sin_cache.size(1);
      const float* sin = cos + half;
      for (const auto& [tensor, heads] : {std::pair{&query, q_heads}, std::pair{&key, k_heads}}) {
        // a token's heads are contiguous; tokens lie the row stride apart
        char* row = static_cast<char*>(tensor->data) + t * tensor->row_stride() * elem;
        for (int64_t h = 0; h < heads; ++h) {
          char* data = row + h * head_dim * elem;
          load_floats(data, tensor->dtype, head.data(), head_dim);
          for (int64_t i = 0; i < half; ++i) {
            // NeoX rotates the two halves of the rotary dims; GPT-J rotates adjacent pairs.
            const int64_t a = is_neox ? i : 2 * i, b = is_neox ? i + half : 2 * i + 1;
            const float x1 = head[a], x2 = head[b];
            head[a] = x1 * cos[i] - x2 * sin[i];
            head[b] = x2 * cos[i] + x1 * sin[i];
          }
          store_floats(head.data(), tensor->dtype, data, head_dim);
        }
      }
    }
  });
}

}  // namespace gnomon::cpu
