// Diagnostic for W12 (BENCHMARKS.md): what splitting W5's batch into micro-batches costs
// the GEMMs alone, with no autograd, RPC or pipeline around them.
//
// MicroBatchGemmMs(chunks, packed) times the GEMMs of one training step of W5's three
// 1024x1024 layers (forward x W^T, input gradient g W, weight gradient g^T x accumulated
// over the micro-batches) when the batch of 128 is fed as `chunks` micro-batches, on
// preallocated buffers. packed = false calls oneDNN's sgemm as kernels::Gemm does (the
// weight is read in its row-major layout by every call); packed = true uses oneDNN matmul
// primitives whose weights were reordered once into the layout the kernel prefers (what a
// weight-layout cache would give), and accumulates the weight gradient in the GEMM
// (sum post-op). Returns the median milliseconds per step.
#pragma once

#include <dnnl.hpp>

#include <vector>

#include "bench_util.h"

namespace gw::bench {

inline double MicroBatchGemmMs(int chunks, bool packed, int warmup, int iters) {
  using dnnl::memory;
  constexpr int64_t kBatch = 128, kWidth = 1024, kLayers = 3;
  const int64_t rows = kBatch / chunks;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const auto f32 = memory::data_type::f32;
  const memory::dims mk{rows, kWidth}, kn{kWidth, kWidth};
  // Row-major W (out x in) seen as the K x N operand of x W^T is the "ba" layout.
  const memory::desc act(mk, f32, memory::format_tag::ab), w_t(kn, f32, memory::format_tag::ba),
      w_n(kn, f32, memory::format_tag::ab), any(kn, f32, memory::format_tag::any);
  const memory::desc g_t({kWidth, rows}, f32, memory::format_tag::ba);  // g^T, g row-major
  const memory::desc dw(kn, f32, memory::format_tag::ab);
  dnnl::primitive_attr accumulate;
  dnnl::post_ops sum;
  sum.append_sum(1.0f);
  accumulate.set_post_ops(sum);
  const dnnl::matmul::primitive_desc fwd_pd(dnnl::matmul::desc(act, packed ? any : w_t, act), eng);
  const dnnl::matmul::primitive_desc bwd_pd(dnnl::matmul::desc(act, packed ? any : w_n, act), eng);
  const dnnl::matmul::primitive_desc wgt_pd(dnnl::matmul::desc(g_t, act, dw), accumulate, eng);
  const dnnl::matmul fwd(fwd_pd), bwd(bwd_pd), wgt(wgt_pd);

  std::vector<std::vector<float>> weights, x, y, g, gin, dws;
  std::vector<memory> w_fwd, w_bwd;
  for (int l = 0; l < kLayers; ++l) {
    weights.emplace_back(kWidth * kWidth, 0.01f);
    x.emplace_back(kBatch * kWidth, 0.1f);
    y.emplace_back(kBatch * kWidth);
    g.emplace_back(kBatch * kWidth, 0.1f);
    gin.emplace_back(kBatch * kWidth);
    dws.emplace_back(kWidth * kWidth);
    memory plain_t(w_t, eng, weights.back().data()), plain_n(w_n, eng, weights.back().data());
    w_fwd.push_back(plain_t);
    w_bwd.push_back(plain_n);
    if (packed) {  // reorder once, as a cache keyed by the weight's version would
      w_fwd.back() = memory(fwd_pd.weights_desc(), eng);
      dnnl::reorder(plain_t, w_fwd.back()).execute(stream, plain_t, w_fwd.back());
      w_bwd.back() = memory(bwd_pd.weights_desc(), eng);
      dnnl::reorder(plain_n, w_bwd.back()).execute(stream, plain_n, w_bwd.back());
    }
  }
  const auto rows_of = [&](std::vector<float>& v, int c) { return v.data() + c * rows * kWidth; };
  const std::vector<double> ms = TimeMs(warmup, iters, [&] {
    for (int c = 0; c < chunks; ++c) {
      for (int l = 0; l < kLayers; ++l) {
        if (packed) {
          fwd.execute(stream, {{DNNL_ARG_SRC, memory(act, eng, rows_of(x[l], c))},
                               {DNNL_ARG_WEIGHTS, w_fwd[l]},
                               {DNNL_ARG_DST, memory(act, eng, rows_of(y[l], c))}});
        } else {
          dnnl_sgemm('N', 'T', rows, kWidth, kWidth, 1, rows_of(x[l], c), kWidth, weights[l].data(), kWidth,
                     0, rows_of(y[l], c), kWidth);
        }
      }
    }
    for (int c = 0; c < chunks; ++c) {
      for (int l = kLayers - 1; l >= 0; --l) {
        if (packed) {
          bwd.execute(stream, {{DNNL_ARG_SRC, memory(act, eng, rows_of(g[l], c))},
                               {DNNL_ARG_WEIGHTS, w_bwd[l]},
                               {DNNL_ARG_DST, memory(act, eng, rows_of(gin[l], c))}});
          wgt.execute(stream, {{DNNL_ARG_SRC, memory(g_t, eng, rows_of(g[l], c))},
                               {DNNL_ARG_WEIGHTS, memory(act, eng, rows_of(x[l], c))},
                               {DNNL_ARG_DST, memory(dw, eng, dws[l].data())}});
        } else {
          dnnl_sgemm('N', 'N', rows, kWidth, kWidth, 1, rows_of(g[l], c), kWidth, weights[l].data(), kWidth, 0,
                     rows_of(gin[l], c), kWidth);
          dnnl_sgemm('T', 'N', kWidth, kWidth, rows, 1, rows_of(g[l], c), kWidth, rows_of(x[l], c), kWidth,
                     c == 0 ? 0.0f : 1.0f, dws[l].data(), kWidth);
        }
      }
    }
  });
  return Quantile(ms, 0.5);
}

}  // namespace gw::bench
