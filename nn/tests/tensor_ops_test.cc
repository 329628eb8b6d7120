// Unit: tensor operations for the distributed models (issue 29) — GELU, SiLU, Erf, Var,
// Gather, MaskedFill/Where, batched broadcast MatMul, LogSoftmax over dim 0 — against
// PyTorch reference values in float64 and float32, and the modules GELU, SiLU, Flatten,
// Dropout2d (names, ToString, shapes, errors).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/nn/layers.h"
#include "gradwire/tensor/kernels.h"
#include "reference.h"

namespace gw::nn {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct RefCase {
  const char* name;
  std::vector<Shape> shapes;
  Fn fn;
};

// The cases of make_reference_tensor_ops.py, in its order.
std::vector<RefCase> RefCases() {
  auto idx = [](std::vector<int64_t> v, Shape s) { return Tensor::FromVector<int64_t>(v, s); };
  return {
      {"gelu", {{4, 5}}, [](auto& x) { return Gelu(x[0] * 3.0); }},
      {"gelu_tanh", {{4, 5}}, [](auto& x) { return Gelu(x[0] * 3.0, GeluApproximate::kTanh); }},
      {"silu", {{4, 5}}, [](auto& x) { return Silu(x[0] * 3.0); }},
      {"erf", {{4, 5}}, [](auto& x) { return Erf(x[0] * 2.0); }},
      {"var_dim1", {{3, 4, 5}}, [](auto& x) { return Var(x[0], {1}); }},
      {"var_dims_keepdim_c0", {{3, 4, 5}}, [](auto& x) { return Var(x[0], {0, 2}, 0, true); }},
      {"var_all", {{3, 4}}, [](auto& x) { return Var(x[0]); }},
      {"gather_dim1", {{3, 4}},
       [idx](auto& x) { return Gather(x[0], 1, idx({2, 0, 2, 1, 1, 0, 0, 3, 3}, {3, 3})); }},
      {"gather_dim0", {{3, 4}},
       [idx](auto& x) { return Gather(x[0], 0, idx({2, 0, 1, 2, 1, 1, 0, 0}, {2, 4})); }},
      {"masked_fill", {{3, 5}},
       [](auto& x) {
         return MaskedFill(x[0], Tensor::FromVector<bool>({true, false, true, false, false}),
                           -2.5);
       }},
      {"where", {{3, 4}, {4}},
       [](auto& x) {
         return Where(Tensor::FromVector<bool>({true, false, true}, {3, 1}), x[0], x[1]);
       }},
      {"matmul_bcast", {{2, 1, 3, 4}, {5, 4, 6}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"matmul_batch_mat", {{2, 3, 4}, {4, 5}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"matmul_mat_batch", {{3, 4}, {2, 4, 5}}, [](auto& x) { return MatMul(x[0], x[1]); }},
      {"matmul_transposed", {{3, 4, 2}, {1, 5, 4}},
       [](auto& x) { return MatMul(Transpose(x[0], -1, -2), Transpose(x[1], -1, -2)); }},
      {"log_softmax_dim0", {{3, 4}}, [](auto& x) { return LogSoftmax(Transpose(x[0], 0, 1), 0); }},
  };
}

class TensorOpsReferenceTest : public ::testing::TestWithParam<DType> {
 protected:
  static void SetUpTestSuite() {
    ref_ = new std::map<std::string, std::vector<double>>(gw::testing::ReadReference(
        GRADWIRE_SOURCE_DIR "/nn/tests/data/tensor_ops_reference.txt"));
  }
  static void TearDownTestSuite() { delete ref_; }

  // |got - want| <= rtol * max(|want|, 1e-2) element-wise (relative, but not below 1e-2 in
  // magnitude, where float32 rounding of a difference of O(1) terms dominates).
  void ExpectClose(const std::string& name, const Tensor& got, double rtol) {
    ASSERT_TRUE(got.defined()) << name;
    auto it = ref_->find(name);
    ASSERT_NE(it, ref_->end()) << "missing reference line " << name;
    const std::vector<double> g = got.ToVector<double>();
    const std::vector<double>& w = it->second;
    ASSERT_EQ(g.size(), w.size()) << name << " shape " << ShapeToString(got.sizes());
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_LE(std::abs(g[i] - w[i]), rtol * std::max(std::abs(w[i]), 1e-2))
          << name << " element " << i << ": " << g[i] << " vs PyTorch " << w[i];
    }
  }

  static std::map<std::string, std::vector<double>>* ref_;
};

std::map<std::string, std::vector<double>>* TensorOpsReferenceTest::ref_ = nullptr;

TEST_P(TensorOpsReferenceTest, OutputsAndGradientsMatchPyTorch) {
  const DType dt = GetParam();
  const std::string suffix = dt == DType::kFloat64 ? ".f64" : ".f32";
  const double rtol = dt == DType::kFloat64 ? 1e-10 : 1e-5;
  ASSERT_FALSE(ref_->empty()) << "missing nn/tests/data/tensor_ops_reference.txt";
  for (const RefCase& c : RefCases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      Tensor x = kernels::ToDType(gw::testing::Det(c.shapes[i], 1.0 + i), dt);
      x.set_requires_grad(true);
      inputs.push_back(x);
    }
    Tensor out = c.fn(inputs);
    EXPECT_EQ(out.dtype(), dt);
    autograd::Backward({Sum(out * kernels::ToDType(gw::testing::Det(out.sizes(), 9.0), dt))});
    ExpectClose(c.name + std::string(".out") + suffix, out, rtol);
    for (size_t i = 0; i < inputs.size(); ++i) {
      ExpectClose(c.name + std::string(".grad") + std::to_string(i) + suffix, inputs[i].grad(),
                  rtol);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TensorOpsReferenceTest,
                         ::testing::Values(DType::kFloat64, DType::kFloat32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// The message of the gw::Error that `f` throws.
std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ActivationModulesTest, NamesReprAndValues) {
  EXPECT_EQ(GELU().ToString(), "GELU(approximate='none')");
  EXPECT_EQ(GELU("tanh").ToString(), "GELU(approximate='tanh')");
  EXPECT_EQ(SiLU().ToString(), "SiLU()");
  EXPECT_EQ(Flatten().ToString(), "Flatten(start_dim=1, end_dim=-1)");
  Generator gen(1);
  EXPECT_EQ(Dropout2d(0.5, gen).ToString(), "Dropout2d(p=0.5)");
  EXPECT_NE(ErrorOf([] { GELU("erf"); }).find("GELU: approximate must be 'none' or 'tanh', got 'erf'"),
            std::string::npos);
  Tensor x = Tensor::FromVector<double>({-1, 0, 2}, {3});
  EXPECT_LT(kernels::MaxAbsDiff(GELU().Forward(x), kernels::Gelu(x)), 1e-15);
  EXPECT_LT(kernels::MaxAbsDiff(SiLU().Forward(x), x * gw::Sigmoid(x)), 1e-15);
}

TEST(FlattenModuleTest, ShapesViewsAndErrors) {
  Flatten flatten;
  Tensor x = Tensor::Zeros({2, 3, 4, 5});
  EXPECT_EQ(flatten.Forward(x).sizes(), Shape({2, 60}));
  EXPECT_EQ(flatten.Forward(x).storage(), x.storage());  // a view
  EXPECT_EQ(Flatten(0, 2).Forward(x).sizes(), Shape({24, 5}));
  EXPECT_EQ(Flatten(-3, -2).Forward(x).sizes(), Shape({2, 12, 5}));
  // A transposed input is copied.
  EXPECT_EQ(flatten.Forward(kernels::Transpose(x, 1, 3)).sizes(), Shape({2, 60}));
  EXPECT_EQ(ErrorOf([&] { Flatten(2, 3).Forward(Tensor::Zeros({64, 784})); }),
            "Flatten(start_dim=2, end_dim=3): cannot flatten input [64, 784]");
}

TEST(Dropout2dTest, ZeroesWholeChannelsInTrainingOnly) {
  Generator gen(2);
  Dropout2d drop(0.5, gen);
  Tensor x = Tensor::Ones({8, 16, 3, 3}, DType::kFloat64);
  Tensor y = drop.Forward(x);
  int zeros = 0;
  for (int64_t n = 0; n < 8; ++n) {
    for (int64_t c = 0; c < 16; ++c) {
      const std::vector<double> plane =
          kernels::Select(kernels::Select(y, 0, n), 0, c).ToVector<double>();
      for (double v : plane) EXPECT_EQ(v, plane[0]);  // the whole plane kept or dropped
      EXPECT_TRUE(plane[0] == 0 || plane[0] == 2);
      zeros += plane[0] == 0;
    }
  }
  EXPECT_GT(zeros, 32);
  EXPECT_LT(zeros, 96);
  // The gradient flows through the kept planes only, scaled.
  Tensor xg = Tensor::Ones({2, 3, 2, 2}, DType::kFloat64);
  xg.set_requires_grad(true);
  Tensor yg = drop.Forward(xg);
  autograd::Backward({Sum(yg)});
  EXPECT_EQ(xg.grad().ToVector<double>(), yg.ToVector<double>());
  drop.Eval();
  EXPECT_TRUE(drop.Forward(x).is_same(x));
  drop.Train();
  EXPECT_EQ(ErrorOf([&] { drop.Forward(Tensor::Zeros({64, 784})); }),
            "Dropout2d: expected input [N, C, H, W] (or [N, C, L]), got [64, 784]");
  EXPECT_THROW(Dropout2d(1.0, gen), Error);
}

TEST(TensorOpsErrorsTest, NameTheOpAndShapes) {
  EXPECT_EQ(ErrorOf([] { MatMul(Tensor::Zeros({2, 3, 4}), Tensor::Zeros({3, 5, 6})); }),
            "MatMul: shapes [2, 3, 4] and [3, 5, 6] cannot be multiplied (4 != 5)");
  EXPECT_EQ(ErrorOf([] { MatMul(Tensor::Zeros({2, 3, 4}), Tensor::Zeros({3, 4, 6})); }),
            "MatMul: batch dimensions of [2, 3, 4] and [3, 4, 6] cannot be broadcast together");
  EXPECT_EQ(ErrorOf([] {
              Gather(Tensor::Zeros({3, 4}), 1, Tensor::FromVector<int64_t>({0, 4}, {1, 2}));
            }),
            "Gather: index 4 is out of range for dimension 1 of size 4 (tensor shape [3, 4])");
  EXPECT_EQ(ErrorOf([] { Gather(Tensor::Zeros({3, 4}), 0, Tensor::Zeros({2}, DType::kInt64)); }),
            "Gather: index [2] must have as many dimensions as the tensor [3, 4]");
  EXPECT_EQ(ErrorOf([] {
              Where(Tensor::Zeros({3}, DType::kBool), Tensor::Zeros({2, 3}), Tensor::Zeros({4}));
            }),
            "Where: shapes [2, 3] and [4] cannot be broadcast together");
  EXPECT_EQ(ErrorOf([] { MaskedFill(Tensor::Zeros({2, 3}), Tensor::Zeros({3}), 1.0); }),
            "MaskedFill: mask must be bool, got float32 [3]");
  EXPECT_EQ(ErrorOf([] { Var(Tensor::Zeros({2, 3}, DType::kInt64)); }),
            "Var: expected a floating tensor, got int64 [2, 3]");
  EXPECT_EQ(ErrorOf([] { Split(Tensor::Zeros({5, 2}), Shape{2, 2}, 0); }),
            "Split: sizes [2, 2] sum to 4 but dimension 0 of [5, 2] has 5");
  EXPECT_EQ(ErrorOf([] { gw::Flatten(Tensor::Zeros({2, 3}), 1, 0); }),
            "Flatten: start_dim 1 comes after end_dim 0 for a tensor of shape [2, 3]");
  EXPECT_EQ(ErrorOf([] { Gelu(Tensor::Zeros({2}, DType::kInt64)); }),
            "Gelu: expected a floating tensor (float32 or float64), got int64");
}

}  // namespace
}  // namespace gw::nn
