// Unit: device maps (resolution, the inverse for replies and gradients, validation naming
// the pair and the device, the launcher's text form) and the choice of path for each pair
// of devices. None of it needs a GPU.
#include "gradwire/rpc/device_map.h"

#include <gtest/gtest.h>

namespace gw::rpc {
namespace {

DeviceMap Map(DeviceMap::Entries entries) {
  absl::StatusOr<DeviceMap> m = DeviceMap::Make("trainer", "ps0", std::move(entries));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : DeviceMap();
}

void ExpectInvalid(const absl::Status& s, std::string_view needle) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(absl::string_view(needle.data(), needle.size())), absl::string_view::npos) << s;
}

TEST(DeviceMapTest, MappedDevicesArriveWhereMappedAndEverythingElseOnTheCpu) {
  const DeviceMap m = Map({{Cuda(0), Cuda(1)}, {Cuda(1), Cuda(0)}});
  EXPECT_EQ(m.Forward(Cuda(0)), Cuda(1));
  EXPECT_EQ(m.Forward(Cuda(1)), Cuda(0));
  EXPECT_EQ(m.Forward(Cuda(2)), kCPU);  // unmapped GPU: the peer's CPU
  EXPECT_EQ(m.Forward(kCPU), kCPU);
  EXPECT_EQ(DeviceMap().Forward(Cuda(0)), kCPU);
}

TEST(DeviceMapTest, RepliesAndGradientsTakeTheInverseSoARoundTripLandsWhereItStarted) {
  const DeviceMap m = Map({{Cuda(0), Cuda(3)}, {kCPU, Cuda(1)}});
  for (const Device d : {Cuda(0), kCPU}) EXPECT_EQ(m.Inverse(m.Forward(d)), d) << d.ToString();
  EXPECT_EQ(m.Inverse(Cuda(3)), Cuda(0));
  EXPECT_EQ(m.Inverse(Cuda(1)), kCPU);
  EXPECT_EQ(m.Inverse(Cuda(2)), kCPU);  // a device nothing maps to: the caller's CPU
  EXPECT_EQ(m.Inverse(kCPU), kCPU);
}

TEST(DeviceMapTest, MapsMustBeOneToOne) {
  ExpectInvalid(DeviceMap::Make("trainer", "ps0", {{Cuda(0), Cuda(0)}, {Cuda(1), Cuda(0)}}).status(),
                "device map trainer -> ps0: cuda:0 and cuda:1 both map to cuda:0 (a map is one-to-one)");
  ExpectInvalid(DeviceMap::Make("trainer", "ps0", {{Cuda(0), Cuda(0)}, {Cuda(0), Cuda(1)}}).status(),
                "device map trainer -> ps0: cuda:0 is mapped twice (to cuda:0 and cuda:1)");
  ExpectInvalid(DeviceMap::Make("a", "b", {{Device{DeviceType::kCUDA, -1}, Cuda(0)}}).status(), "cannot exist");
  ExpectInvalid(DeviceMap::Make("a", "b", {{Device{DeviceType::kCPU, 2}, Cuda(0)}}).status(), "cannot exist");
}

TEST(DeviceMapTest, DevicesMustExistOnTheirSide) {
  const DeviceMap m = Map({{Cuda(1), Cuda(0)}});
  EXPECT_TRUE(m.CheckDevices(2, 1).ok());
  ExpectInvalid(m.CheckDevices(1, 1), "device map trainer -> ps0: cuda:1 is not a device of trainer (it has 1 GPU)");
  ExpectInvalid(m.CheckDevices(2, 0), "device map trainer -> ps0: cuda:0 is not a device of ps0 (it has 0 GPUs)");
  EXPECT_TRUE(Map({{kCPU, kCPU}}).CheckDevices(0, 0).ok());
}

TEST(DeviceMapTest, ParsesTheLaunchersTextAndPrintsItBack) {
  absl::StatusOr<DeviceMaps> maps =
      DeviceMaps::Parse("trainer", "ps0=cuda:0->cuda:1, cuda:1->cuda:0; ps1 = cuda:0->cpu");
  ASSERT_TRUE(maps.ok()) << maps.status();
  EXPECT_EQ(maps->ToString(), "ps0=cuda:0->cuda:1,cuda:1->cuda:0;ps1=cuda:0->cpu");
  EXPECT_EQ(maps->Toward("ps0").Forward(Cuda(1)), Cuda(0));
  EXPECT_EQ(maps->Toward("ps0").from(), "trainer");
  EXPECT_EQ(maps->Toward("ps1").Forward(Cuda(0)), kCPU);
  EXPECT_TRUE(maps->Toward("nobody").empty());
  EXPECT_TRUE(DeviceMaps::Parse("trainer", "")->empty());
  ExpectInvalid(DeviceMaps::Parse("t", "ps0=cuda:0").status(), "'cuda:0' is not LOCAL->REMOTE");
  ExpectInvalid(DeviceMaps::Parse("t", "cuda:0->cuda:1").status(), "names no peer");
  ExpectInvalid(DeviceMaps::Parse("t", "ps0=gpu0->cuda:1").status(), "'gpu0' is not a device");
  ExpectInvalid(DeviceMaps::Parse("t", "ps0=cuda:0->cuda:1;ps0=cuda:1->cuda:0").status(), "names a peer twice");
  ExpectInvalid(DeviceMaps::Parse("t", "ps0=cuda:0->cuda:1,cuda:2->cuda:1").status(), "device map t -> ps0");
}

TEST(DeviceMapTest, PathForEachPairOfDevices) {
  struct Case {
    Device from, to;
    bool same_host, ipc;
    TensorPath path;
  };
  const Case cases[] = {
      {kCPU, kCPU, true, true, TensorPath::kHost},          {kCPU, kCPU, false, false, TensorPath::kHost},
      {Cuda(0), Cuda(0), true, true, TensorPath::kCudaIpc},  // two processes on one GPU
      {Cuda(0), Cuda(1), true, true, TensorPath::kCudaIpc},  // two GPUs of one host
      {Cuda(0), Cuda(0), true, false, TensorPath::kStaged},  // IPC refused (containers, MIG)
      {Cuda(0), Cuda(0), false, true, TensorPath::kStaged},  // across hosts
      {Cuda(0), kCPU, true, true, TensorPath::kStaged},      // GPU trainer -> CPU server
      {kCPU, Cuda(0), false, false, TensorPath::kStaged},    // CPU server -> GPU trainer
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ChoosePath(c.from, c.to, c.same_host, c.ipc), c.path)
        << c.from.ToString() << " -> " << c.to.ToString() << " same_host=" << c.same_host << " ipc=" << c.ipc;
  }
  EXPECT_EQ(TensorPathName(TensorPath::kCudaIpc), "cuda-ipc");
}

}  // namespace
}  // namespace gw::rpc
