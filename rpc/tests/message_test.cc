// Units: GlobalId, and the typed records of the internal protocols (message.h), also
// through the real envelope codec.
#include "gradwire/rpc/message.h"

#include <gtest/gtest.h>

#include <optional>
#include <thread>
#include <variant>

#include "absl/container/flat_hash_set.h"
#include "gradwire/rpc/global_id.h"
#include "gradwire/tensor/kernels.h"
#include "wire/codec.h"

namespace gw::rpc {
namespace {

TEST(GlobalIdTest, CarriesRankAndCounterAndIsNeverZero) {
  const GlobalId id = GlobalId::Make(0, 1);
  EXPECT_TRUE(id.valid());
  EXPECT_NE(id.bits(), 0u);  // rank 0, counter 1 is not the null word
  EXPECT_EQ(id.rank(), 0);
  EXPECT_EQ(id.counter(), 1u);
  EXPECT_EQ(id.ToString(), "0:1");
  const GlobalId big = GlobalId::Make(GlobalId::kMaxRanks - 1, GlobalId::kCounterMask);
  EXPECT_EQ(big.rank(), GlobalId::kMaxRanks - 1);
  EXPECT_EQ(big.counter(), GlobalId::kCounterMask);
  EXPECT_FALSE(GlobalId().valid());
  EXPECT_EQ(GlobalId().rank(), -1);
  EXPECT_EQ(GlobalId().ToString(), "null");
  EXPECT_EQ(GlobalId::FromBits(id.bits()), id);
  EXPECT_FALSE(GlobalId::FromBits(0).has_value());
  EXPECT_FALSE(GlobalId::FromBits(7).has_value());                     // no rank bits
  EXPECT_FALSE(GlobalId::FromBits(uint64_t{3} << 48).has_value());     // no counter
  EXPECT_LT(GlobalId::Make(0, 9), GlobalId::Make(1, 1));              // by rank, then counter
}

TEST(GlobalIdTest, GeneratorsOfDifferentRanksNeverCollideAcrossThreads) {
  GlobalIdGenerator a(0), b(1);
  absl::flat_hash_set<GlobalId> seen;
  absl::Mutex mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<GlobalId> mine;
      for (int i = 0; i < 5000; ++i) mine.push_back((t % 2 == 0 ? a : b).Next());
      absl::MutexLock lock(&mu);
      for (GlobalId id : mine) EXPECT_TRUE(seen.insert(id).second) << id.ToString();
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(seen.size(), 20000u);
}

TEST(GlobalIdTest, TravelsAsOneWordAndRejectsGarbage) {
  const GlobalId id = GlobalId::Make(3, 42);
  absl::StatusOr<GlobalId> back = ValueTraits<GlobalId>::From(ValueTraits<GlobalId>::To(id));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, id);
  EXPECT_EQ(*ValueTraits<GlobalId>::From(Value(int64_t{0})), GlobalId());
  EXPECT_FALSE(ValueTraits<GlobalId>::From(Value(int64_t{5})).ok());
  EXPECT_FALSE(ValueTraits<GlobalId>::From(Value(std::string("5"))).ok());
}

struct Inner {
  int64_t n = 0;
  std::optional<Tensor> grad;
  static constexpr auto Fields() { return std::make_tuple(Field("n", &Inner::n), Field("grad", &Inner::grad)); }
};

enum class Color { kRed = 0, kBlue = 1 };

struct Sample {
  static constexpr char kFunction[] = "__test.sample";
  using Reply = Ack;
  GlobalId id;
  std::string name;
  std::vector<Inner> items;
  Color color = Color::kRed;
  bool flag = false;
  static constexpr auto Fields() {
    return std::make_tuple(Field("id", &Sample::id), Field("name", &Sample::name), Field("items", &Sample::items),
                           Field("color", &Sample::color), Field("flag", &Sample::flag));
  }
};
static_assert(Record<Sample> && ProtocolMessage<Sample> && !ProtocolMessage<Inner>);

// Two alternatives with fields of their own (like optim::OptimizerConfig).
struct Circle {
  double r = 1;
  static constexpr auto Fields() { return std::make_tuple(std::pair{"r", &Circle::r}); }
};
struct Box {
  double w = 1, h = 2;
  static constexpr auto Fields() { return std::make_tuple(std::pair{"w", &Box::w}, std::pair{"h", &Box::h}); }
};
using Shape2 = std::variant<Circle, Box>;

Sample Filled() {
  Sample s;
  s.id = GlobalId::Make(2, 7);
  s.name = "weights";
  s.items = {Inner{1, Tensor::Arange(0, 4)}, Inner{2, std::nullopt}};
  s.color = Color::kBlue;
  s.flag = true;
  return s;
}

void ExpectSame(const Sample& a, const Sample& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.name, b.name);
  ASSERT_EQ(a.items.size(), b.items.size());
  for (size_t i = 0; i < a.items.size(); ++i) {
    EXPECT_EQ(a.items[i].n, b.items[i].n);
    ASSERT_EQ(a.items[i].grad.has_value(), b.items[i].grad.has_value());
    if (a.items[i].grad) {
      EXPECT_EQ(kernels::MaxAbsDiff(*a.items[i].grad, *b.items[i].grad), 0.0);
    }
  }
  EXPECT_EQ(a.color, b.color);
  EXPECT_EQ(a.flag, b.flag);
}

TEST(MessageTest, RecordsRoundTripThroughTheEnvelopeCodec) {
  internal::Envelope env;
  env.kind = internal::Kind::kRequest;
  env.id = 9;
  env.function = Sample::kFunction;
  env.payload = ValueTraits<Sample>::To(Filled());
  absl::StatusOr<Message> wire = internal::EncodeEnvelope(env);
  ASSERT_TRUE(wire.ok()) << wire.status();
  EXPECT_EQ(wire->tensors.size(), 1u);  // tensors travel out of band, none for the empty optional
  absl::StatusOr<internal::Envelope> back = internal::DecodeEnvelope(*std::move(wire));
  ASSERT_TRUE(back.ok()) << back.status();
  absl::StatusOr<Sample> s = ValueTraits<Sample>::From(back->payload);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectSame(Filled(), *s);
}

TEST(MessageTest, MismatchesNameTheRecordAndTheField) {
  ValueList fields = std::get<ValueList>(ValueTraits<Sample>::To(Filled()).storage());
  ValueList wrong = fields;
  wrong[1] = Value(int64_t{3});  // name: a string
  absl::StatusOr<Sample> bad = ValueTraits<Sample>::FromList(wrong);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "Sample.name: expected string, got int");
  ValueList nested = fields;
  std::get<ValueList>(std::get<ValueList>(nested[2].storage())[1].storage())[0] = Value(1.5);
  bad = ValueTraits<Sample>::FromList(nested);
  EXPECT_EQ(bad.status().message(), "Sample.items: Inner.n: expected int, got double") << bad.status();
  ValueList short_list(fields.begin(), fields.begin() + 3);
  bad = ValueTraits<Sample>::FromList(short_list);
  EXPECT_NE(bad.status().message().find("expected 5 fields, got 3"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("protocol version"), std::string::npos) << bad.status();
  EXPECT_FALSE(ValueTraits<Sample>::From(Value(std::string("garbage"))).ok());
  EXPECT_EQ(ValueTraits<Ack>::To(Ack{}).get<ValueList>().size(), 0u);
}

TEST(MessageTest, VariantsTravelByAlternativeName) {
  const Shape2 box = Box{3, 4};
  absl::StatusOr<Shape2> back = ValueTraits<Shape2>::From(ValueTraits<Shape2>::To(box));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(std::holds_alternative<Box>(*back));
  EXPECT_EQ(std::get<Box>(*back).w, 3);
  EXPECT_EQ(std::get<Box>(*back).h, 4);
  absl::StatusOr<Shape2> unknown = ValueTraits<Shape2>::From(Value(ValueList{Value("Triangle"), Value(ValueList{})}));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("'Triangle' is not one of Circle, Box"), std::string::npos)
      << unknown.status();
  EXPECT_FALSE(ValueTraits<Shape2>::From(Value(int64_t{1})).ok());
}

TEST(MessageTest, ReservedNamesAreThoseOfTheProtocols) {
  EXPECT_TRUE(IsReservedName("__rref.remote"));
  EXPECT_TRUE(IsReservedName("__anything"));
  EXPECT_FALSE(IsReservedName("_private"));
  EXPECT_FALSE(IsReservedName("add"));
  EXPECT_FALSE(IsReservedName(""));
}

}  // namespace
}  // namespace gw::rpc
