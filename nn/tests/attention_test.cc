// Unit: MultiheadAttention, TransformerEncoderLayer and TransformerEncoder against PyTorch
// reference values (make_reference_attention.py) in float64 and float32 (float32 runs on
// oneDNN): outputs, attention weights, input and parameter gradients; plus state-dict keys,
// initialisation, dropout, and error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/nn/attention.h"
#include "gradwire/nn/transformer.h"
#include "gradwire/tensor/kernels.h"
#include "reference.h"

namespace gw::nn {
namespace {

constexpr int64_t L = 3, S = 4, N = 2, E = 4, H = 2, FF = 6;

// One input: a leaf det(shape) or, with `perm`, a permuted view of shape `shape` of one.
struct Input {
  Shape shape;
  Shape perm = {};
};

using Outputs = std::pair<Tensor, Tensor>;  // (output, weights or undefined)
using Fn = std::function<Outputs(const std::vector<Tensor>&)>;

Tensor CausalBool(int64_t n) {
  return kernels::Gt(kernels::Reshape(Tensor::Arange(0, static_cast<double>(n)), {1, n}),
                     kernels::Reshape(Tensor::Arange(0, static_cast<double>(n)), {n, 1}));
}

Tensor Padding(std::vector<bool> values, Shape shape) {
  return Tensor::FromVector<bool>(values, std::move(shape));
}

class AttentionReferenceTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    ref_ = gw::testing::ReadReference(GRADWIRE_SOURCE_DIR "/nn/tests/data/attention_reference.txt");
    ASSERT_FALSE(ref_.empty()) << "missing nn/tests/data/attention_reference.txt";
  }

  DType dtype() const { return GetParam(); }
  Tensor Det(const Shape& s, double k) const {
    return kernels::ToDType(gw::testing::Det(s, k), dtype());
  }

  // Relative to the tensor's largest value: 1e-10 in float64, 1e-5 in float32.
  void ExpectMatches(const std::string& name, const Tensor& t) {
    ASSERT_TRUE(ref_.count(name)) << name;
    ASSERT_TRUE(t.defined()) << name;
    const std::vector<double>& want = ref_[name];
    const std::vector<double> got = t.ToVector<double>();
    ASSERT_EQ(got.size(), want.size()) << name;
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    const double tol = (dtype() == DType::kFloat64 ? 1e-10 : 1e-5) * std::max(scale, 1e-3);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], tol) << name << "[" << i << "]";
    }
  }

  // What make_reference_attention.py's run() does: parameter i set to det(1 + i/2), input
  // j det(3 + j) (through a permuted view where given), output gradient det(9) and
  // weights gradient det(10); checks outputs, weights and gradients.
  void Run(const std::string& name, Module& m, const std::vector<Input>& inputs, const Fn& fn) {
    {
      autograd::NoGradGuard no_grad;
      double k = 1;
      for (const auto& [_, p] : m.NamedParameters()) {
        kernels::CopyInPlace(p, Det(p.sizes(), k));
        k += 0.5;
      }
    }
    std::vector<Tensor> leaves, xs;
    for (size_t j = 0; j < inputs.size(); ++j) {
      const Input& in = inputs[j];
      Shape base = in.shape;
      for (size_t i = 0; i < in.perm.size(); ++i) base[in.perm[i]] = in.shape[i];
      leaves.push_back(Det(base, 3.0 + static_cast<double>(j)).set_requires_grad(true));
      xs.push_back(in.perm.empty() ? leaves.back() : gw::Permute(leaves.back(), in.perm));
      ASSERT_EQ(xs.back().sizes(), in.shape);
    }
    const auto [out, weights] = fn(xs);
    std::vector<Tensor> roots{out}, grads{Det(out.sizes(), 9)};
    if (weights.defined()) {
      roots.push_back(weights);
      grads.push_back(Det(weights.sizes(), 10));
    }
    autograd::Backward(roots, grads);
    ExpectMatches(name + ".out", out);
    EXPECT_EQ(weights.defined(), ref_.count(name + ".weights") == 1) << name;
    if (weights.defined()) ExpectMatches(name + ".weights", weights);
    for (size_t j = 0; j < leaves.size(); ++j) {
      ExpectMatches(name + ".grad.input" + std::to_string(j), leaves[j].grad());
    }
    for (const auto& [p_name, p] : m.NamedParameters()) {
      ExpectMatches(name + ".grad." + p_name, p.grad());
    }
  }

  std::map<std::string, std::vector<double>> ref_;
  Generator gen_{5};
};

// Forward of `m` on (x[0], x[0], x[0]) (self-attention) or (x[0], x[1], x[2]).
Fn Attend(MultiheadAttention& m, AttentionArgs args = {}) {
  return [&m, args](const std::vector<Tensor>& x) {
    return x.size() == 1 ? m.Forward(x[0], x[0], x[0], args) : m.Forward(x[0], x[1], x[2], args);
  };
}

// Forward of an encoder layer or encoder with (mask, key padding mask).
template <typename M>
Fn Encode(M& m, Tensor mask, Tensor padding = {}) {
  return [&m, mask, padding](const std::vector<Tensor>& x) {
    return Outputs(m.Forward(x[0], mask, padding), Tensor());
  };
}

TEST_P(AttentionReferenceTest, SelfAttention) {
  MultiheadAttention m(E, H, gen_, {.dtype = dtype()});
  Run("mha_self", m, {{{L, N, E}}}, Attend(m));
}

TEST_P(AttentionReferenceTest, SelfAttentionBatchFirstStridedWithPaddingPerHeadWeights) {
  MultiheadAttention m(E, H, gen_, {.batch_first = true, .dtype = dtype()});
  Run("mha_self_strided", m, {{{N, L, E}, {1, 2, 0}}},
      Attend(m, {.key_padding_mask = Padding({false, false, true, false, false, false}, {N, L}),
                 .average_attn_weights = false}));
}

TEST_P(AttentionReferenceTest, CrossAttentionWithFloatMaskAndPadding) {
  MultiheadAttention m(E, H, gen_, {.dtype = dtype()});
  Run("mha_cross", m, {{{L, N, E}}, {{S, N, E}}, {{S, N, E}}},
      Attend(m, {.key_padding_mask =
                     Padding({false, false, false, true, true, false, false, false}, {N, S}),
                 .attn_mask = Det({L, S}, 7)}));
}

TEST_P(AttentionReferenceTest, CrossAttentionBatchFirstStridedKeyWithoutWeights) {
  MultiheadAttention m(E, H, gen_, {.batch_first = true, .dtype = dtype()});
  Run("mha_cross_bf", m, {{{N, L, E}}, {{N, S, E}, {0, 2, 1}}, {{N, S, E}}},
      Attend(m, {.need_weights = false}));
}

TEST_P(AttentionReferenceTest, CausalFloatMask) {
  MultiheadAttention m(E, H, gen_, {.dtype = dtype()});
  Run("mha_causal_float", m, {{{L, N, E}}},
      Attend(m, {.attn_mask = GenerateSquareSubsequentMask(L, dtype())}));
}

TEST_P(AttentionReferenceTest, CausalBoolMaskFromIsCausal) {
  MultiheadAttention m(E, H, gen_, {.dtype = dtype()});
  Run("mha_causal_bool", m, {{{L, N, E}}},
      Attend(m, {.average_attn_weights = false, .is_causal = true}));
}

TEST_P(AttentionReferenceTest, PerHeadMaskWithoutBias) {
  MultiheadAttention m(E, H, gen_, {.bias = false, .dtype = dtype()});
  Run("mha_head_mask", m, {{{L, N, E}}}, Attend(m, {.attn_mask = Det({N * H, L, L}, 8)}));
}

TEST_P(AttentionReferenceTest, Unbatched) {
  MultiheadAttention m(E, H, gen_, {.dtype = dtype()});
  Run("mha_unbatched", m, {{{L, E}}, {{S, E}}, {{S, E}}},
      Attend(m, {.key_padding_mask = Padding({false, true, false, false}, {S})}));
}

TEST_P(AttentionReferenceTest, EncoderLayerPostNorm) {
  TransformerEncoderLayer m(E, H, gen_, {.dim_feedforward = FF, .dropout = 0, .dtype = dtype()});
  Run("layer_post", m, {{{L, N, E}}},
      Encode(m, Tensor(), Padding({false, false, true, false, false, false}, {N, L})));
}

TEST_P(AttentionReferenceTest, EncoderLayerPreNormGeluBatchFirstInEval) {
  TransformerEncoderLayer m(E, H, gen_,
                            {.dim_feedforward = FF, .dropout = 0.1, .activation = "gelu",
                             .batch_first = true, .norm_first = true, .dtype = dtype()});
  m.Eval();
  Run("layer_pre_gelu", m, {{{N, L, E}, {1, 0, 2}}},
      Encode(m, GenerateSquareSubsequentMask(L, dtype())));
}

TEST_P(AttentionReferenceTest, EncoderOfTwoLayersWithFinalNorm) {
  TransformerEncoder m(E, H, 2, gen_, {.dim_feedforward = FF, .dropout = 0, .dtype = dtype()},
                       std::make_shared<LayerNorm>(Shape{E}, LayerNormOptions{.dtype = dtype()}));
  Run("encoder", m, {{{L, N, E}}}, Encode(m, CausalBool(L)));
}

INSTANTIATE_TEST_SUITE_P(DTypes, AttentionReferenceTest,
                         ::testing::Values(DType::kFloat64, DType::kFloat32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

std::vector<std::string> Keys(const Module& m) {
  std::vector<std::string> keys;
  for (const auto& [name, _] : m.StateDict()) keys.push_back(name);
  return keys;
}

const std::vector<std::string> kLayerKeys = {
    "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
    "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
    "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"};

TEST(AttentionModulesTest, StateDictKeysArePyTorchsInOrder) {
  Generator gen(1);
  EXPECT_EQ(Keys(MultiheadAttention(8, 2, gen)),
            (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                      "out_proj.bias"}));
  EXPECT_EQ(Keys(MultiheadAttention(8, 2, gen, {.bias = false})),
            (std::vector<std::string>{"in_proj_weight", "out_proj.weight"}));
  EXPECT_EQ(Keys(TransformerEncoderLayer(8, 2, gen, {.dim_feedforward = 16})), kLayerKeys);
  std::vector<std::string> encoder_keys;
  for (const char* layer : {"layers.0.", "layers.1."}) {
    for (const std::string& key : kLayerKeys) encoder_keys.push_back(layer + key);
  }
  encoder_keys.push_back("norm.weight");
  encoder_keys.push_back("norm.bias");
  EXPECT_EQ(Keys(TransformerEncoder(8, 2, 2, gen, {.dim_feedforward = 16},
                                    std::make_shared<LayerNorm>(Shape{8}))),
            encoder_keys);
}

TEST(AttentionModulesTest, DefaultInitialisationIsPyTorchs) {
  Generator gen(2);
  MultiheadAttention m(64, 4, gen);
  const std::vector<double> w = m.in_proj_weight().ToVector<double>();
  const double bound = std::sqrt(6.0 / (64 + 3 * 64));  // xavier_uniform of [3E, E]
  double sum_sq = 0;
  for (double v : w) {
    EXPECT_LE(std::abs(v), bound);
    sum_sq += v * v;
  }
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(w.size())), bound / std::sqrt(3.0), 0.01);
  EXPECT_EQ(kernels::MaxAll(kernels::Abs(m.in_proj_bias())).item(), 0);
  EXPECT_EQ(kernels::MaxAll(kernels::Abs(m.out_proj().bias())).item(), 0);
  EXPECT_GT(kernels::MaxAll(kernels::Abs(m.out_proj().weight())).item(), 0);
}

TEST(AttentionModulesTest, EncoderLayersStartAsCopiesOfTheLayerAndDropDifferently) {
  Generator gen(3);
  TransformerEncoderLayer layer(8, 2, gen, {.dim_feedforward = 16, .dropout = 0.5});
  layer.Eval();
  TransformerEncoder encoder(layer, 3, gen);
  ASSERT_EQ(encoder.num_layers(), 3);
  const NamedTensors original = layer.StateDict();
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(encoder.layer(i).is_training());
    const NamedTensors copy = encoder.layer(i).StateDict();
    ASSERT_EQ(copy.size(), original.size());
    for (size_t j = 0; j < copy.size(); ++j) {
      EXPECT_FALSE(copy[j].second.is_same(original[j].second));  // copies, not shared
      EXPECT_EQ(kernels::MaxAbsDiff(copy[j].second, original[j].second), 0) << copy[j].first;
    }
  }
  // In training, two copies given the same input drop different units.
  encoder.Train();
  const Tensor x = Tensor::Randn({5, 2, 8}, gen);
  autograd::NoGradGuard no_grad;
  EXPECT_GT(kernels::MaxAbsDiff(encoder.layer(0).Forward(x), encoder.layer(1).Forward(x)), 0);
}

TEST(AttentionModulesTest, DropoutOnlyInTraining) {
  Generator gen(4);
  MultiheadAttention m(8, 2, gen, {.dropout = 0.5});
  const Tensor x = Tensor::Randn({5, 3, 8}, gen);
  autograd::NoGradGuard no_grad;
  m.Eval();
  const auto [eval_out, eval_weights] = m.Forward(x, x, x, {.average_attn_weights = false});
  const auto [again, _] = m.Forward(x, x, x);
  EXPECT_EQ(kernels::MaxAbsDiff(eval_out, again), 0);
  m.Train();
  const auto [train_out, train_weights] = m.Forward(x, x, x, {.average_attn_weights = false});
  EXPECT_GT(kernels::MaxAbsDiff(train_out, eval_out), 0);
  // Dropped-out weights: zeros, and the kept ones scaled by 2.
  const std::vector<double> tw = train_weights.ToVector<double>();
  const std::vector<double> ew = eval_weights.ToVector<double>();
  int zeros = 0;
  for (size_t i = 0; i < tw.size(); ++i) {
    if (tw[i] == 0) {
      ++zeros;
    } else {
      EXPECT_NEAR(tw[i], 2 * ew[i], 1e-6);
    }
  }
  EXPECT_GT(zeros, 0);
}

TEST(AttentionModulesTest, SingleTensorForwardIsSelfAttention) {
  Generator gen(6);
  MultiheadAttention m(8, 2, gen);
  const Tensor x = Tensor::Randn({5, 3, 8}, gen);
  EXPECT_LT(kernels::MaxAbsDiff(m.Forward(x), m.Forward(x, x, x).first), 1e-6);
  EXPECT_EQ(m.ToString(),
            "MultiheadAttention(embed_dim=8, num_heads=2, dropout=0, bias=true, batch_first=false)");
}

TEST(AttentionModulesTest, ToStringListsTheChildren) {
  Generator gen(7);
  TransformerEncoderLayer layer(8, 2, gen, {.dim_feedforward = 16});
  const std::string s = layer.ToString();
  EXPECT_EQ(s.rfind("TransformerEncoderLayer(\n  (self_attn): MultiheadAttention(", 0), 0u) << s;
  EXPECT_NE(s.find("  (linear1): Linear(in_features=8, out_features=16, bias=true)\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("  (dropout2): Dropout(p=0.1)\n)"), std::string::npos) << s;
}

std::string Message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(AttentionModulesTest, ErrorsNameTheModuleAndShapes) {
  Generator gen(8);
  EXPECT_EQ(Message([&] { MultiheadAttention(10, 3, gen); }),
            "MultiheadAttention: embed_dim=10 must be a positive multiple of num_heads=3");
  MultiheadAttention m(8, 2, gen);
  const Tensor x = Tensor::Zeros({3, 2, 8});
  EXPECT_EQ(Message([&] { m.Forward(Tensor::Zeros({3, 2, 6}), x, x); }),
            "MultiheadAttention(embed_dim=8, num_heads=2): expected query [L, N, 8] or [L, 8], "
            "got [3, 2, 6]");
  EXPECT_EQ(Message([&] { m.Forward(x, Tensor::Zeros({4, 2, 8}), Tensor::Zeros({5, 2, 8})); }),
            "MultiheadAttention(embed_dim=8, num_heads=2): key [4, 2, 8] and value [5, 2, 8] must "
            "have the same shape");
  EXPECT_EQ(Message([&] { m.Forward(x, x, x, {.attn_mask = Tensor::Zeros({3, 4})}); }),
            "MultiheadAttention(embed_dim=8, num_heads=2): expected attn_mask [L, S] = [3, 3] or "
            "[N * num_heads, L, S] = [4, 3, 3], got [3, 4]");
  EXPECT_EQ(Message([&] { m.Forward(x, x, x, {.key_padding_mask = Tensor::Zeros({3, 2})}); }),
            "MultiheadAttention(embed_dim=8, num_heads=2): expected key_padding_mask [N, S] = "
            "[2, 3], got [3, 2]");
  EXPECT_EQ(Message([&] { m.Forward(kernels::ToDType(x, DType::kFloat64), x, x); }),
            "MultiheadAttention(embed_dim=8, num_heads=2): expected float32 inputs, got float64 "
            "[3, 2, 8]");
  EXPECT_EQ(Message([&] { TransformerEncoderLayer(8, 2, gen, {.activation = "tanh"}); }),
            "TransformerEncoderLayer: activation should be relu/gelu, not tanh");
  EXPECT_EQ(Message([&] { TransformerEncoderLayer(8, 3, gen); }),
            "TransformerEncoderLayer: d_model=8 must be a positive multiple of nhead=3");
  TransformerEncoderLayer layer(8, 2, gen, {.dim_feedforward = 16});
  EXPECT_EQ(Message([&] { layer.Forward(Tensor::Zeros({4, 6})); }),
            "TransformerEncoderLayer(d_model=8, nhead=2): expected src [S, N, 8] or [S, 8], got "
            "[4, 6]");
}

}  // namespace
}  // namespace gw::nn
