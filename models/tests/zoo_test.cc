// The zoo's models against the same models written in PyTorch (bench/pytorch/zoo.py):
// state-dict keys, order and shapes; outputs, loss, every parameter's gradient, BatchNorm's
// running statistics and eval-mode outputs, in float64, on deterministic weights
// (models/tests/make_reference_zoo.py; the values are kept in data/zoo_reference.txt).
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/functions.h"
#include "gradwire/models/zoo.h"
#include "gradwire/nn/loss.h"
#include "gradwire/tensor/kernels.h"
#include "gtest/gtest.h"

namespace gw::models {
namespace {

struct Entry {
  std::string name;
  std::vector<double> values;
};

// The reference file in its order (state-dict order matters).
std::vector<Entry> ReadInOrder(const std::string& path) {
  std::vector<Entry> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    Entry e;
    ls >> e.name;
    double v;
    while (ls >> v) e.values.push_back(v);
    out.push_back(std::move(e));
  }
  return out;
}

Tensor Det(const Shape& shape, double k) {
  std::vector<double> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + k);
  return Tensor::FromVector<double>(v, shape);
}

// make_reference_zoo.py's fill(): the value of state-dict entry number i.
Tensor Fill(const std::string& name, const Shape& shape, int64_t i) {
  if (absl::EndsWith(name, "num_batches_tracked")) return Tensor::Zeros(shape, DType::kInt64);
  const Tensor det = Det(shape, static_cast<double>(i));
  if (absl::EndsWith(name, "running_var")) return kernels::AddScalar(kernels::MulScalar(det, 0.5), 1.0);
  if (shape.size() >= 2) {
    return kernels::MulScalar(det, 1.0 / std::sqrt(static_cast<double>(NumElements(shape) / shape[0])));
  }
  return kernels::MulScalar(det, 0.1);
}

// Dropout modules and attention (whose weights' dropout follows its training flag) in eval.
void DropoutOff(nn::Module& m) {
  if (absl::StartsWith(m.type_name(), "Dropout") || m.type_name() == "MultiheadAttention") m.Eval();
  for (const auto& [_, child] : m.children()) DropoutOff(*child);
}

// |a - b| <= tol * scale for every element.
void ExpectNear(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                double scale) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-9 * scale) << what << " [" << i << "]";
  }
}

double MaxAbs(const std::vector<double>& v) {
  double m = 1e-3;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

class ZooTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    for (Entry& e : ReadInOrder(GRADWIRE_SOURCE_DIR "/models/tests/data/zoo_reference.txt")) {
      const std::string prefix = GetParam() + ".";
      if (absl::StartsWith(e.name, prefix)) ref_.push_back({e.name.substr(prefix.size()), std::move(e.values)});
    }
    ASSERT_FALSE(ref_.empty()) << "no reference values for " << GetParam();
  }
  std::vector<double> Ref(const std::string& name) const {
    for (const Entry& e : ref_) {
      if (e.name == name) return e.values;
    }
    ADD_FAILURE() << "no reference value " << GetParam() << "." << name;
    return {};
  }
  std::vector<Entry> ref_;
};

TEST_P(ZooTest, MatchesPyTorchStateDictOutputsAndGradients) {
  Generator gen(0);
  absl::StatusOr<std::shared_ptr<nn::Module>> made = Create(GetParam(), gen, DType::kFloat64);
  ASSERT_TRUE(made.ok()) << made.status();
  nn::Module& model = **made;

  // Keys, order and shapes as PyTorch's state_dict().
  nn::NamedTensors state;
  std::vector<std::string> keys;
  for (const Entry& e : ref_) {
    if (!absl::StartsWith(e.name, "key.")) continue;
    Shape shape(e.values.begin(), e.values.end());
    keys.push_back(e.name.substr(4));
    state.emplace_back(keys.back(), Fill(keys.back(), shape, static_cast<int64_t>(state.size())));
  }
  std::vector<std::string> mine;
  for (const auto& [name, t] : model.StateDict()) mine.push_back(name);
  ASSERT_EQ(mine, keys) << "state-dict keys differ from PyTorch's";
  ASSERT_TRUE(model.LoadStateDict(state).ok());

  model.Train();
  DropoutOff(model);
  const Tensor x = Det({4, 1, 28, 28}, 0.5);
  const Tensor y = Tensor::FromVector<int64_t>({0, 1, 2, 3});
  const Tensor out = model.Forward(x);
  const Tensor loss = GetParam() == "cnn" ? nn::NllLoss(out, y) : nn::CrossEntropyLoss(out, y);
  autograd::Backward({loss});

  const std::vector<double> want_out = Ref("out");
  ExpectNear("out", out.ToVector<double>(), want_out, MaxAbs(want_out));
  ExpectNear("loss", {loss.item()}, Ref("loss"), 1.0);
  for (const auto& [name, p] : model.NamedParameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(p.grad().defined());
    const std::vector<double> g = p.grad().ToVector<double>();
    const std::vector<double> want = Ref("grad." + name);
    double sum = 0, abs_sum = 0;
    for (double v : g) sum += v, abs_sum += std::abs(v);
    ExpectNear("grad sum", {sum, abs_sum}, {want[0], want[1]}, std::max(want[1], 1e-3));
    std::vector<double> head(g.begin(), g.begin() + std::min<size_t>(8, g.size()));
    ExpectNear("grad head", head, std::vector<double>(want.begin() + 2, want.end()), MaxAbs(want));
  }
  for (const auto& [name, b] : model.NamedBuffers()) {
    if (!absl::StrContains(name, "running")) continue;
    const std::vector<double> want = Ref("running." + name);
    ExpectNear(name, b.ToVector<double>(), want, MaxAbs(want));
  }
  model.Eval();
  const std::vector<double> want_eval = Ref("eval_out");
  ExpectNear("eval_out", model.Forward(x).ToVector<double>(), want_eval, MaxAbs(want_eval));
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooTest, ::testing::Values("cnn", "resnet", "lstm", "vit"),
                         [](const auto& info) { return info.param; });

TEST(ZooErrors, NamesTheModelAndBothShapes) {
  Generator gen(0);
  for (const std::string& name : ModelNames()) {
    auto model = Create(name, gen);
    ASSERT_TRUE(model.ok());
    try {
      (*model)->Forward(Tensor::Zeros({64, 28}));
      FAIL() << name << " took a [64, 28] input";
    } catch (const Error& e) {
      EXPECT_TRUE(absl::StrContains(e.what(), "expected input [N, 1, 28, 28] or [N, 784], got [64, 28]")) << e.what();
    }
  }
  EXPECT_EQ(Create("alexnet", gen).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ZooForward, AcceptsImagesAndFlattenedBatchesAlike) {
  Generator gen(3);
  for (const std::string& name : ModelNames()) {
    auto model = Create(name, gen);
    ASSERT_TRUE(model.ok());
    (*model)->Eval();
    Generator data(1);
    const Tensor x = Tensor::Randn({2, 784}, data);
    const Tensor a = (*model)->Forward(x);
    const Tensor b = (*model)->Forward(kernels::Reshape(x, {2, 1, 28, 28}));
    EXPECT_EQ(a.sizes(), (Shape{2, 10})) << name;
    EXPECT_EQ(kernels::MaxAbsDiff(a, b), 0.0) << name;
  }
}

}  // namespace
}  // namespace gw::models
