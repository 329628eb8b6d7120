// Unit: the normalization kernels' float32 paths (oneDNN's layer norm, oneDNN's batch norm
// on channels-last data, the own kernel elsewhere) against the float64 own kernel on the
// same values, on contiguous, channels-last and strided inputs; gradient masks; errors.
// (Values against PyTorch: nn/tests/normalization_test.cc; gradients against finite
// differences: autograd/tests/normalization_gradcheck_test.cc.)
#include "gradwire/tensor/normalization.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "gradwire/tensor/kernels.h"

namespace gw::kernels {
namespace {

// float32 values, and the same values in float64.
struct Pair {
  Tensor f32, f64;
};

Pair Values(const Shape& s, Generator& gen, double shift = 0) {
  Tensor t = ToDType(AddScalar(Tensor::Randn(s, gen, DType::kFloat64), shift), DType::kFloat32);
  return {t, ToDType(t, DType::kFloat64)};
}

// A [N, C, H, W] view of [N, H, W, C] data.
Pair ChannelsLast(const Pair& p) {
  auto cl = [](const Tensor& t) { return Permute(Contiguous(Permute(t, {0, 2, 3, 1})), {0, 3, 1, 2}); };
  return {cl(p.f32), cl(p.f64)};
}

void ExpectClose(const Tensor& got32, const Tensor& want64, const std::string& what) {
  ASSERT_TRUE(got32.defined()) << what;
  ASSERT_EQ(got32.dtype(), DType::kFloat32) << what;
  double scale = 1e-3;
  for (double v : want64.ToVector<double>()) scale = std::max(scale, std::abs(v));
  EXPECT_LE(MaxAbsDiff(got32, want64), 1e-5 * scale) << what;
}

void ExpectGradsClose(const NormGrads& got, const NormGrads& want, const std::string& what) {
  ExpectClose(got.input, want.input, what + " dx");
  ExpectClose(got.weight, want.weight, what + " dweight");
  ExpectClose(got.bias, want.bias, what + " dbias");
}

TEST(NormalizationKernelTest, BatchNormFloat32MatchesFloat64OnEveryLayout) {
  Generator gen(3);
  for (const Shape& s : {Shape{8, 16, 7, 5}, Shape{6, 3, 4, 4}, Shape{10, 5}, Shape{4, 6, 9}}) {
    const Pair plain = Values(s, gen, 0.5), g = Values(s, gen);
    const Pair w = Values({s[1]}, gen, 1), b = Values({s[1]}, gen);
    std::vector<std::string> layouts = {"plain"};
    if (s.size() == 4) layouts = {"plain", "channels-last", "transposed"};
    for (const std::string& name : layouts) {
      Pair x = plain, gl = g;
      if (name == "channels-last") x = ChannelsLast(plain), gl = ChannelsLast(g);
      if (name == "transposed") {
        x = {Transpose(plain.f32, 2, 3), Transpose(plain.f64, 2, 3)};
        gl = {Transpose(g.f32, 2, 3), Transpose(g.f64, 2, 3)};
      }
      const std::string what = name + " " + ShapeToString(s);
      const NormResult r32 = BatchNormForward(x.f32, w.f32, b.f32, 1e-5);
      const NormResult r64 = BatchNormForward(x.f64, w.f64, b.f64, 1e-5);
      ExpectClose(r32.out, r64.out, what + " out");
      ExpectClose(r32.mean, r64.mean, what + " mean");
      ExpectClose(r32.var, r64.var, what + " var");
      if (name == "channels-last") {
        EXPECT_EQ(r32.out.strides(), x.f32.strides()) << what;
      }
      for (bool batch_stats : {true, false}) {
        ExpectGradsClose(
            BatchNormBackward(gl.f32, x.f32, r32.mean, r32.var, w.f32, 1e-5, batch_stats),
            BatchNormBackward(gl.f64, x.f64, r64.mean, r64.var, w.f64, 1e-5, batch_stats),
            what + (batch_stats ? " train" : " eval"));
      }
      ExpectClose(BatchNormInference(x.f32, r32.mean, r32.var, w.f32, b.f32, 1e-5),
                  BatchNormInference(x.f64, r64.mean, r64.var, w.f64, b.f64, 1e-5),
                  what + " inference");
    }
  }
}

TEST(NormalizationKernelTest, LayerNormAndGroupNormFloat32MatchFloat64) {
  Generator gen(4);
  const Pair x = Values({6, 7, 32}, gen, -0.3), g = Values({6, 7, 32}, gen);
  const Pair w = Values({32}, gen, 1), b = Values({32}, gen);
  for (bool strided : {false, true}) {
    const Pair xi = strided ? Pair{Transpose(Contiguous(Transpose(x.f32, 0, 1)), 0, 1),
                                   Transpose(Contiguous(Transpose(x.f64, 0, 1)), 0, 1)}
                            : x;
    const NormResult l32 = LayerNormForward(xi.f32, 1, w.f32, b.f32, 1e-5);
    const NormResult l64 = LayerNormForward(xi.f64, 1, w.f64, b.f64, 1e-5);
    ExpectClose(l32.out, l64.out, "layer norm out");
    ExpectClose(l32.var, l64.var, "layer norm var");
    ExpectGradsClose(LayerNormBackward(g.f32, xi.f32, l32.mean, l32.var, w.f32, 1, 1e-5),
                     LayerNormBackward(g.f64, xi.f64, l64.mean, l64.var, w.f64, 1, 1e-5),
                     "layer norm");
  }
  // Group norm over [6, 32, 7] (a transposed view), no weight, with a bias.
  const Pair gb = Values({32}, gen), gg = Values({6, 32, 7}, gen);
  const Tensor t32 = Transpose(x.f32, 1, 2), t64 = Transpose(x.f64, 1, 2);
  const NormResult g32 = GroupNormForward(t32, 8, Tensor(), gb.f32, 1e-5);
  const NormResult g64 = GroupNormForward(t64, 8, Tensor(), gb.f64, 1e-5);
  ExpectClose(g32.out, g64.out, "group norm out");
  const NormGradMask mask{.weight = false};
  const NormGrads d32 = GroupNormBackward(gg.f32, t32, g32.mean, g32.var, Tensor(), 8, 1e-5, mask);
  const NormGrads d64 = GroupNormBackward(gg.f64, t64, g64.mean, g64.var, Tensor(), 8, 1e-5, mask);
  ExpectClose(d32.input, d64.input, "group norm dx");
  ExpectClose(d32.bias, d64.bias, "group norm dbias");
  EXPECT_FALSE(d32.weight.defined());
}

TEST(NormalizationKernelTest, BackwardComputesOnlyTheMaskedGradients) {
  Generator gen(5);
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    const Tensor x = ToDType(Tensor::Randn({4, 3, 5}, gen, DType::kFloat64), dt);
    const Tensor w = Tensor::Ones({3}, dt);
    const NormResult r = BatchNormForward(x, w, Tensor(), 1e-5);
    for (NormGradMask m : {NormGradMask{true, false, false}, NormGradMask{false, true, false},
                           NormGradMask{false, false, true}, NormGradMask{true, true, true}}) {
      const NormGrads gr = BatchNormBackward(x, x, r.mean, r.var, w, 1e-5, true, m);
      EXPECT_EQ(gr.input.defined(), m.input);
      EXPECT_EQ(gr.weight.defined(), m.weight);
      EXPECT_EQ(gr.bias.defined(), m.bias);
    }
  }
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(NormalizationKernelTest, ErrorsNameTheOpAndShapes) {
  const Tensor x = Tensor::Zeros({2, 3, 4});
  EXPECT_EQ(ErrorOf([&] { BatchNormForward(Tensor::Zeros({5}), Tensor(), Tensor(), 1e-5); }),
            "BatchNorm: expected input [N, C, *], got [5]");
  EXPECT_EQ(ErrorOf([&] { BatchNormForward(x, Tensor::Ones({4}), Tensor(), 1e-5); }),
            "BatchNorm: weight must be [3] for input [2, 3, 4], got [4]");
  EXPECT_EQ(ErrorOf([&] { BatchNormInference(x, Tensor::Zeros({3}), Tensor::Ones({2}), Tensor(),
                                             Tensor(), 1e-5); }),
            "BatchNorm: var must be [3] for input [2, 3, 4], got [2]");
  EXPECT_EQ(ErrorOf([&] {
              BatchNormBackward(Tensor::Zeros({2, 3}), x, Tensor::Zeros({3}), Tensor::Ones({3}),
                                Tensor(), 1e-5, true);
            }),
            "BatchNormBackward: gradient [2, 3] does not match input [2, 3, 4]");
  EXPECT_EQ(ErrorOf([&] { LayerNormForward(x, 4, Tensor(), Tensor(), 1e-5); }),
            "LayerNorm: cannot normalize the last 4 dims of input [2, 3, 4]");
  EXPECT_EQ(ErrorOf([&] { GroupNormForward(x, 2, Tensor(), Tensor(), 1e-5); }),
            "GroupNorm: num_groups=2 must divide the channels of input [2, 3, 4]");
  EXPECT_EQ(ErrorOf([&] {
              GroupNormForward(Tensor::Zeros({2, 3, 4}, DType::kInt64), 1, Tensor(), Tensor(), 1e-5);
            }),
            "GroupNorm: expected a floating tensor (float32 or float64), got int64");
}

}  // namespace
}  // namespace gw::kernels
