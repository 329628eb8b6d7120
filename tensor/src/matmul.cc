// Matrix products: Gemm (on gemm.h: oneDNN sgemm for float32, a blocked loop for float64),
// MatMul with NumPy semantics (batched products through one oneDNN matmul primitive in
// float32), and the fused Linear.
#include <algorithm>
#include <optional>
#include <string_view>

#include "cuda/cuda_kernels.h"
#include "dispatch.h"
#include "dnnl_util.h"
#include "gemm.h"
#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

using internal::GemmOperand;
using internal::MatrixLayout;
using internal::RowMajorGemm;

std::optional<MatrixLayout> MatrixLayoutOf(const Tensor& t) {
  const int64_t nd = t.dim();
  return internal::LayoutOf(t.sizes()[nd - 2], t.sizes()[nd - 1], t.strides()[nd - 2],
                            t.strides()[nd - 1]);
}

// `t` itself when its matrices (last two dims) are row- or column-major, else a copy.
Tensor GemmReady(const Tensor& t) { return MatrixLayoutOf(t) ? t : Contiguous(t); }

// The matrix of `t` (last two dims) at element offset `offset`, transposed when `trans`.
// REQUIRES: GemmReady(t) is t.
template <typename T>
GemmOperand<T> OperandOf(const Tensor& t, bool trans, int64_t offset = 0) {
  return internal::Operand(t.data<T>() + offset, *MatrixLayoutOf(t), trans);
}

// oneDNN's descriptor of a batched operand: a batch dimension of stride 0 (an expanded
// view) becomes a size-1 dimension, which the matmul primitive broadcasts itself.
dnnl::memory::desc BatchDesc(const Tensor& t) {
  Shape sizes = t.sizes();
  for (int64_t d = 0; d + 2 < t.dim(); ++d) {
    if (t.strides()[d] == 0) sizes[d] = 1;
  }
  return dnnl::memory::desc(internal::DnnlDims(sizes), dnnl::memory::data_type::f32,
                            internal::DnnlDims(t.strides()));
}

// out = a x b for float32 operands of out's rank through one oneDNN matmul primitive
// (cached by layout). False when oneDNN offers only its reference implementation for
// these strides (the caller copies or loops instead).
bool DnnlBatchedMatMul(const Tensor& a, const Tensor& b, const Tensor& out) {
  static internal::PrimitiveCache<dnnl::matmul> cache;
  std::vector<int64_t> key;
  internal::AppendLayout(&key, a);
  internal::AppendLayout(&key, b);
  internal::AppendLayout(&key, out);
  const dnnl::matmul prim = *cache.Get(key, [&] {
    try {
      dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(BatchDesc(a), BatchDesc(b), internal::PlainDesc(out)),
          internal::UserScratchpad(), internal::CpuEngine());
      if (std::string_view(pd.impl_info_str()).starts_with("ref")) return dnnl::matmul();
      return dnnl::matmul(pd);
    } catch (const dnnl::error&) {
      return dnnl::matmul();  // unimplemented for these strides
    }
  });
  if (!prim) return false;
  out.storage()->BumpVersion();
  internal::RunDnnl("MatMul", [&](dnnl::stream& stream) {
    auto& engine = internal::CpuEngine();
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(BatchDesc(a), engine, a.raw_data())},
        {DNNL_ARG_WEIGHTS, dnnl::memory(BatchDesc(b), engine, b.raw_data())},
        {DNNL_ARG_DST, internal::Dnnl(out)}};
    std::vector<Tensor> keep;
    internal::AddScratchpad(prim, args, keep);
    prim.execute(stream, args);
  });
  out.storage()->BumpVersion();
  return true;
}

// Stride of each batch dimension of `t` seen at `batch` (0 where t broadcasts).
Shape BatchStrides(const Tensor& t, const Shape& batch) {
  Shape strides(batch.size());
  for (size_t d = 0; d < batch.size(); ++d) {
    strides[d] = t.sizes()[d] == 1 ? 0 : t.strides()[d];
  }
  return strides;
}

// out[i] = a[i] x b[i] over out's batch dimensions, for a [..., m, k], b [..., k, n] and a
// contiguous out [..., m, n] of one rank; a batch dimension of size 1 (or stride 0) in a
// or b broadcasts. float32 runs as one oneDNN matmul; float64 (and float32 operands
// oneDNN takes only through its reference code) loops over the batch with one GEMM each.
void BatchedMatMul(Tensor a, Tensor b, const Tensor& out) {
  const int64_t nd = out.dim();
  const int64_t m = out.sizes()[nd - 2], n = out.sizes()[nd - 1], k = a.sizes()[nd - 1];
  if (out.numel() == 0) return;
  if (k == 0) {
    Fill(out, 0);
    return;
  }
  a = GemmReady(a);
  b = GemmReady(b);
  if (a.dtype() == DType::kFloat32) {
    if (DnnlBatchedMatMul(a, b, out)) return;
    if (!a.is_contiguous() || !b.is_contiguous()) {
      if (DnnlBatchedMatMul(Contiguous(a), Contiguous(b), out)) return;
    }
  }
  const Shape batch(out.sizes().begin(), out.sizes().end() - 2);
  const auto loop = internal::MakeLoop<3>(
      batch, {Shape(out.strides().begin(), out.strides().end() - 2), BatchStrides(a, batch),
              BatchStrides(b, batch)});
  out.storage()->BumpVersion();
  internal::DispatchFloating("MatMul", a.dtype(), [&]<typename T>() {
    T* po = out.data<T>();
    internal::RunLoop(loop, [&](const std::array<int64_t, 3>& off, int64_t count,
                                const std::array<int64_t, 3>& s) {
      for (int64_t i = 0; i < count; ++i) {
        RowMajorGemm(OperandOf<T>(a, false, off[1] + i * s[1]),
                     OperandOf<T>(b, false, off[2] + i * s[2]), m, n, k, 1.0, 0.0,
                     po + off[0] + i * s[0], n);
      }
    });
  });
  out.storage()->BumpVersion();
}

// `t` with leading size-1 dimensions up to rank `nd`.
Tensor AtRank(const Tensor& t, int64_t nd) {
  Tensor out = t;
  while (out.dim() < nd) out = Unsqueeze(out, 0);
  return out;
}

}  // namespace

void Gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
          double beta, const Tensor& c) {
  const bool gpu = internal::cuda::OnCuda("Gemm", c, {&a, &b});
  if (!gpu) {
    internal::CheckDefined("Gemm", a);
    internal::CheckDefined("Gemm", b);
    internal::CheckDefined("Gemm", c);
  }
  GW_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "Gemm", "expects 2-D tensors, got ",
           ShapeToString(a.sizes()), ", ", ShapeToString(b.sizes()), " and ",
           ShapeToString(c.sizes()));
  internal::CheckSameDType("Gemm", a, b);
  internal::CheckSameDType("Gemm", a, c);
  const int64_t m = trans_a ? a.sizes()[1] : a.sizes()[0];
  const int64_t k = trans_a ? a.sizes()[0] : a.sizes()[1];
  const int64_t kb = trans_b ? b.sizes()[1] : b.sizes()[0];
  const int64_t n = trans_b ? b.sizes()[0] : b.sizes()[1];
  GW_CHECK(k == kb && c.sizes()[0] == m && c.sizes()[1] == n, "Gemm", "shapes ",
           ShapeToString(a.sizes()), (trans_a ? "^T" : ""), " x ", ShapeToString(b.sizes()),
           (trans_b ? "^T" : ""), " -> ", ShapeToString(c.sizes()), " do not match");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: C = beta * C
    if (beta == 0) {
      Fill(c, 0);
    } else {
      ScaleInPlace(c, beta);
    }
    return;
  }
  // The output must be row-major; otherwise compute into a temporary and copy back.
  const bool c_ok = c.strides()[1] == 1 && (c.strides()[0] >= n || m == 1);
  // Writes to c: directly (bumping the version around them), or through CopyInPlace.
  if (c_ok) c.storage()->BumpVersion();
  Tensor out = c_ok ? c : Contiguous(c);
  const int64_t ldc = m == 1 ? n : out.strides()[0];
  const Tensor ra = GemmReady(a), rb = GemmReady(b);
  if (gpu) {
    internal::cuda::Gemm(trans_a, trans_b, alpha, ra, rb, beta, out);
  } else {
    internal::DispatchFloating("Gemm", a.dtype(), [&]<typename T>() {
      RowMajorGemm(OperandOf<T>(ra, trans_a), OperandOf<T>(rb, trans_b), m, n, k, alpha, beta, out.data<T>(), ldc);
    });
  }
  if (c_ok) {
    c.storage()->BumpVersion();
  } else {
    CopyInPlace(c, out);
  }
}

Tensor MatMul(const Tensor& a, const Tensor& b) {
  const bool gpu = internal::cuda::OnCuda("MatMul", a, {&b});
  if (!gpu) {
    internal::CheckDefined("MatMul", a);
    internal::CheckDefined("MatMul", b);
  }
  GW_CHECK(a.dim() >= 1 && b.dim() >= 1, "MatMul", "operands must have at least one dimension, got ",
           ShapeToString(a.sizes()), " and ", ShapeToString(b.sizes()));
  internal::CheckSameDType("MatMul", a, b);
  const int64_t ka = a.sizes().back();
  const int64_t kb = b.dim() == 1 ? b.sizes()[0] : b.sizes()[b.dim() - 2];
  GW_CHECK(ka == kb, "MatMul", "shapes ", ShapeToString(a.sizes()), " and ",
           ShapeToString(b.sizes()), " cannot be multiplied (", ka, " != ", kb, ")");
  if (a.dim() == 1 && b.dim() == 1) {
    return Reshape(MatMul(Unsqueeze(a, 0), Unsqueeze(b, 1)), {});
  }
  if (a.dim() == 1) return Squeeze(MatMul(Unsqueeze(a, 0), b), -2);
  if (b.dim() == 1) return Squeeze(MatMul(a, Unsqueeze(b, 1)), -1);
  const int64_t m = a.sizes()[a.dim() - 2];
  const int64_t n = b.sizes().back();
  if (a.dim() == 2 && b.dim() == 2) {
    Tensor out = Tensor::Empty({m, n}, a.dtype(), a.device());
    Gemm(false, false, 1.0, a, b, 0.0, out);
    return out;
  }
  if (b.dim() == 2 && a.is_contiguous()) {  // fold the batch into the rows: one GEMM
    Tensor out = MatMul(Flatten2D(a), b);
    Shape sizes = a.sizes();
    sizes.back() = n;
    return Reshape(out, sizes);
  }
  // Batched, with broadcast batch dimensions.
  const int64_t nd = std::max(a.dim(), b.dim());
  const Tensor ea = AtRank(a, nd), eb = AtRank(b, nd);
  Shape out_sizes(nd);
  for (int64_t d = 0; d + 2 < nd; ++d) {
    const int64_t sa = ea.sizes()[d], sb = eb.sizes()[d];
    GW_CHECK(sa == sb || sa == 1 || sb == 1, "MatMul", "batch dimensions of ",
             ShapeToString(a.sizes()), " and ", ShapeToString(b.sizes()),
             " cannot be broadcast together");
    out_sizes[d] = sa == 1 ? sb : sa;
  }
  out_sizes[nd - 2] = m;
  out_sizes[nd - 1] = n;
  Tensor out = Tensor::Empty(out_sizes, a.dtype(), a.device());
  if (gpu) {  // one strided-batched cuBLAS call over the broadcast batch, flattened
    const int64_t k = ka;
    Shape batch(out_sizes.begin(), out_sizes.end() - 2);
    const int64_t count = NumElements(batch);
    auto as_batch = [&](const Tensor& t, int64_t rows, int64_t cols) {
      Shape sizes = batch;
      sizes.push_back(rows);
      sizes.push_back(cols);
      return Reshape(Contiguous(Expand(t, sizes)), {count, rows, cols});
    };
    internal::cuda::Gemm(false, false, 1.0, as_batch(ea, m, k), as_batch(eb, k, n), 0.0, Reshape(out, {count, m, n}));
    return out;
  }
  BatchedMatMul(ea, eb, out);
  return out;
}

Tensor Linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (!internal::cuda::OnCuda("Linear", x, {&w, &bias})) {
    internal::CheckDefined("Linear", x);
    internal::CheckDefined("Linear", w);
  }
  GW_CHECK(w.dim() == 2 && x.dim() >= 1 && x.sizes().back() == w.sizes()[1], "Linear",
           "input ", ShapeToString(x.sizes()), " does not match weight ",
           ShapeToString(w.sizes()), " (expected [..., ", w.dim() == 2 ? w.sizes()[1] : -1, "])");
  const int64_t out_features = w.sizes()[0];
  if (bias.defined()) {
    GW_CHECK(bias.dim() == 1 && bias.sizes()[0] == out_features, "Linear", "bias ",
             ShapeToString(bias.sizes()), " does not match weight ", ShapeToString(w.sizes()));
  }
  Tensor x2 = Flatten2D(x);
  Tensor out = Tensor::Empty({x2.sizes()[0], out_features}, x.dtype(), x.device());
  if (bias.defined()) CopyInPlace(out, bias);
  Gemm(false, true, 1.0, x2, w, bias.defined() ? 1.0 : 0.0, out);
  Shape sizes = x.sizes();
  sizes.back() = out_features;
  return Reshape(out, sizes);
}

}  // namespace gw::kernels
