// Device maps in the agent and on the wire, as far as they go without a GPU: what a frame
// says about its tensors' devices (nothing when all are CPU tensors), the inverse map a
// caller applies to a reply, frames that put tensors on GPUs the receiver lacks, the checks
// at Start (this worker's GPUs, the peer's GPUs from its record, the peer's existence),
// GRADWIRE_DEVICE_MAPS, and calls between agents that have maps. The same paths with GPU
// tensors run in gradwire_rpc_gpu_tests (label gpu).
#include <gtest/gtest.h>

#include <thread>

#include "agent_group.h"
#include "gradwire/proto/rpc.pb.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/device_map.h"
#include "gradwire/tensor/cuda.h"
#include "gradwire/tensor/kernels.h"
#include "wire/codec.h"

namespace gw::rpc {
namespace {

using internal::DecodeEnvelope;
using internal::EncodeEnvelope;
using internal::Envelope;
using internal::Kind;
using internal::Placement;

DeviceMap Map(std::string_view from, std::string_view to, DeviceMap::Entries entries) {
  absl::StatusOr<DeviceMap> m = DeviceMap::Make(from, to, std::move(entries));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : DeviceMap();
}

Tensor Values() {
  Generator gen(3);
  return Tensor::Randn({2, 3}, gen);
}

Envelope WithTensor(Kind kind, const Tensor& t) {
  Envelope e;
  e.kind = kind;
  e.id = 7;
  e.function = "f";
  e.payload = Value(ValueList{Value(t)});
  return e;
}

// The devices the frame's header names.
std::vector<int32_t> DevicesOf(const Message& m) {
  gradwire::proto::Envelope env;
  EXPECT_TRUE(env.ParseFromString(m.header));
  return {env.devices().begin(), env.devices().end()};
}

// The frame with its header's device list replaced.
Message WithDevices(Message m, std::vector<int32_t> devices) {
  gradwire::proto::Envelope env;
  EXPECT_TRUE(env.ParseFromString(m.header));
  env.clear_devices();
  for (int32_t d : devices) env.add_devices(d);
  EXPECT_TRUE(env.SerializeToString(&m.header));
  return m;
}

Tensor OnlyTensor(const Envelope& e) { return e.payload.get<ValueList>().at(0).get<Tensor>(); }

void ExpectError(const absl::Status& s, absl::StatusCode code, std::string_view needle) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(absl::string_view(needle.data(), needle.size())), absl::string_view::npos) << s;
}

TEST(DevicesOnTheWireTest, CpuTensorsGoingToCpusAddNothingToTheFrame) {
  const Tensor t = Values();
  const DeviceMap to_cpu = Map("w0", "w1", {{kCPU, kCPU}});
  for (const DeviceMap* map : {static_cast<const DeviceMap*>(nullptr), &to_cpu}) {
    absl::StatusOr<Message> m = EncodeEnvelope(WithTensor(Kind::kRequest, t), map);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(DevicesOf(*m).empty());
    absl::StatusOr<Envelope> back = DecodeEnvelope(*std::move(m));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(OnlyTensor(*back).device(), kCPU);
    EXPECT_EQ(kernels::MaxAbsDiff(OnlyTensor(*back), t), 0.0);
  }
}

TEST(DevicesOnTheWireTest, ARequestNamesWhereItsTensorsArriveAndAReceiverWithoutThatGpuRefusesIt) {
  // The sender maps its CPU onto the peer's cuda:1: the frame names cuda:1 for the tensor.
  const DeviceMap map = Map("w0", "w1", {{kCPU, Cuda(1)}});
  absl::StatusOr<Message> m = EncodeEnvelope(WithTensor(Kind::kRequest, Values()), &map);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(DevicesOf(*m), std::vector<int32_t>{1});
  // This worker has no GPU (or one): the frame is refused, saying why.
  for (int gpus : {0, 1}) {
    absl::StatusOr<Envelope> back = DecodeEnvelope(*m, Placement{nullptr, gpus});
    ExpectError(back.status(), absl::StatusCode::kDataLoss, "puts tensor 0 on cuda:1, but this worker has");
  }
}

TEST(DevicesOnTheWireTest, AReplySaysWhereItsTensorsWereAndTheCallerTakesTheInverseOfItsMap) {
  absl::StatusOr<Message> reply = EncodeEnvelope(WithTensor(Kind::kResponse, Values()));
  ASSERT_TRUE(reply.ok()) << reply.status();
  // As a callee with its result on cuda:1 would send it.
  const Message from_gpu = WithDevices(*reply, {1});
  // A caller without a map takes it on its CPU.
  absl::StatusOr<Envelope> plain = DecodeEnvelope(from_gpu, Placement{nullptr, 0});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(OnlyTensor(*plain).device(), kCPU);
  // A caller whose CPU maps onto the callee's cuda:1 takes it back on its CPU.
  const DeviceMap cpu_to_1 = Map("w0", "w1", {{kCPU, Cuda(1)}});
  absl::StatusOr<Envelope> mapped = DecodeEnvelope(from_gpu, Placement{&cpu_to_1, 0});
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(OnlyTensor(*mapped).device(), kCPU);
  // A caller whose cuda:0 maps onto cuda:1 takes it on its cuda:0 (which it does not have).
  const DeviceMap gpu_to_1 = Map("w0", "w1", {{Cuda(0), Cuda(1)}});
  ExpectError(DecodeEnvelope(from_gpu, Placement{&gpu_to_1, 0}).status(), absl::StatusCode::kDataLoss,
              "puts tensor 0 on cuda:0");
}

TEST(DevicesOnTheWireTest, DeviceListsThatDoNotFitTheFrameAreRefused) {
  absl::StatusOr<Message> m = EncodeEnvelope(WithTensor(Kind::kRequest, Values()));
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectError(DecodeEnvelope(WithDevices(*m, {-1, -1})).status(), absl::StatusCode::kDataLoss,
              "names the devices of 2 tensors but carries 1");
  ExpectError(DecodeEnvelope(WithDevices(*m, {-7})).status(), absl::StatusCode::kDataLoss, "names no device (-7)");
  ExpectError(DecodeEnvelope(WithDevices(*m, {1 << 20})).status(), absl::StatusCode::kDataLoss, "names no device");
  absl::StatusOr<Envelope> cpu = DecodeEnvelope(WithDevices(*m, {-1}));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(OnlyTensor(*cpu).device(), kCPU);
}

// ---------------------------------------------------------------- Start

class DeviceMapStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StoreServer::Start("127.0.0.1", 0, Security::FromEnv().value_or(Security{}));
    ASSERT_TRUE(server.ok()) << server.status();
    store_ = *std::move(server);
  }
  AgentOptions Options(int rank, int world) const {
    AgentOptions o;
    o.rank = rank;
    o.world_size = world;
    o.rendezvous = store_->address();
    o.host_store = false;
    o.start_timeout = absl::Seconds(20);
    o.shutdown_timeout = absl::Seconds(2);
    return o;
  }
  std::unique_ptr<StoreServer> store_;
};

TEST_F(DeviceMapStartTest, AMapOntoGpusThisWorkerLacksFailsBeforeItIsAnnounced) {
  AgentOptions o = Options(0, 1);
  o.device_maps.Set(Map("worker0", "worker1", {{Cuda(0), Cuda(0)}}));
  absl::StatusOr<std::shared_ptr<Agent>> agent = Agent::Start(o);
  ExpectError(agent.status(), absl::StatusCode::kInvalidArgument,
              absl::StrCat("device map worker0 -> worker1: cuda:0 is not a device of worker0 (it has ",
                           cuda::Available() ? cuda::DeviceCount() : 0));
}

TEST_F(DeviceMapStartTest, AMapOfAnotherWorkerIsRefused) {
  AgentOptions o = Options(0, 1);
  o.device_maps.Set(Map("trainer", "worker1", {{kCPU, kCPU}}));
  ExpectError(Agent::Start(o).status(), absl::StatusCode::kInvalidArgument,
              "device map trainer -> worker1: AgentOptions of worker0 hold maps from worker0 only");
}

TEST_F(DeviceMapStartTest, AMapTowardAWorkerOutsideTheGroupIsRefused) {
  AgentOptions o = Options(0, 1);
  o.device_maps.Set(Map("worker0", "worker7", {{kCPU, kCPU}}));
  ExpectError(Agent::Start(o).status(), absl::StatusCode::kInvalidArgument,
              "device map worker0 -> worker7: no worker of this group is named worker7 (its workers: worker0)");
}

TEST_F(DeviceMapStartTest, AMapOntoGpusThePeerLacksFailsOnceItsRecordIsRead) {
  // worker0 maps its CPU onto worker1's cuda:5; worker1's record says how many GPUs it has.
  AgentOptions o0 = Options(0, 2), o1 = Options(1, 2);
  o0.device_maps.Set(Map("worker0", "worker1", {{kCPU, Cuda(5)}}));
  absl::StatusOr<std::shared_ptr<Agent>> a0, a1;
  std::thread t1([&] { a1 = Agent::Start(o1); });
  a0 = Agent::Start(o0);
  t1.join();
  ExpectError(a0.status(), absl::StatusCode::kInvalidArgument,
              "device map worker0 -> worker1: cuda:5 is not a device of worker1 (it has ");
  ASSERT_TRUE(a1.ok()) << a1.status();  // worker1 has no map: it started, and sees worker0 leave
  (void)(*a1)->Shutdown();
}

TEST(DeviceMapAgentTest, CallsBetweenWorkersWithMapsCarryTheirTensorsAndRecordsTheirGpus) {
  auto group = testing::AgentGroup::Start(
      2,
      [](Agent& a) {
        if (absl::Status s = a.Register("device_of", [](Tensor x) { return x.device().ToString(); }); !s.ok()) return s;
        return a.Register("twice", [](Tensor x) { return kernels::MulScalar(x, 2.0); });
      },
      {},
      [](int rank, AgentOptions& o) {
        const std::string self = absl::StrCat("worker", rank), peer = absl::StrCat("worker", 1 - rank);
        o.device_maps.Set(Map(self, peer, {{kCPU, kCPU}}));
      });
  ASSERT_NE(group, nullptr);
  const Tensor x = Values();
  EXPECT_EQ((*group)[0].Sync<std::string>("worker1", "device_of", x).value_or("?"), "cpu");
  absl::StatusOr<Tensor> r = (*group)[0].Sync<Tensor>("worker1", "twice", x);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->device(), kCPU);
  EXPECT_EQ(kernels::MaxAbsDiff(*r, kernels::MulScalar(x, 2.0)), 0.0);
  const int gpus = cuda::Available() ? cuda::DeviceCount() : 0;
  for (const WorkerInfo& w : (*group)[1].members()) EXPECT_EQ(w.gpus, gpus) << w.name;
  ASSERT_TRUE(group->ShutdownAll().ok());
}

TEST(DeviceMapAgentTest, FromEnvReadsGradwireDeviceMapsAsTheMapsOfThisWorker) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "3", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "1234", 1);
  ::setenv("GRADWIRE_DEVICE_MAPS", "worker1=cuda:0->cuda:1;worker2=cuda:0->cuda:0,cuda:1->cuda:1", 1);
  absl::StatusOr<AgentOptions> o = AgentOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device_maps.Toward("worker1").from(), "worker0");
  EXPECT_EQ(o->device_maps.Toward("worker1").Forward(Cuda(0)), Cuda(1));
  EXPECT_EQ(o->device_maps.Toward("worker2").Forward(Cuda(1)), Cuda(1));
  EXPECT_TRUE(o->device_maps.Toward("worker3").empty());
  ::setenv("GRADWIRE_WORKER_NAME", "trainer", 1);
  o = AgentOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device_maps.Toward("worker1").from(), "trainer");
  ::setenv("GRADWIRE_DEVICE_MAPS", "worker1=cuda:0->cuda:1,cuda:1->cuda:1", 1);
  ExpectError(AgentOptions::FromEnv().status(), absl::StatusCode::kInvalidArgument,
              "GRADWIRE_DEVICE_MAPS=worker1=cuda:0->cuda:1,cuda:1->cuda:1: device map trainer -> worker1: cuda:0 and "
              "cuda:1 both map to cuda:1");
  for (const char* v :
       {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GRADWIRE_DEVICE_MAPS", "GRADWIRE_WORKER_NAME"}) {
    ::unsetenv(v);
  }
}

}  // namespace
}  // namespace gw::rpc
