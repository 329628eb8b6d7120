// InferenceEndpoint and InferenceClient (inference_endpoint.h): a client that is not a
// worker of the job calls a served model over gRPC.
#include "gradwire/serve/inference_endpoint.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "agent_group.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/proto/inference.grpc.pb.h"
#include "gradwire/tensor/kernels.h"
#include "serve_testing.h"

namespace gw::serve {
namespace {

TEST(InferenceEndpointTest, ClientOutsideTheJobPredictsThroughTheEndpoint) {
  std::vector<std::shared_ptr<Serving>> serving(3);
  absl::Mutex mu;
  auto agents = rpc::testing::AgentGroup::Start(3, [&](rpc::Agent& a) -> absl::Status {
    absl::StatusOr<std::shared_ptr<Serving>> s = Serving::Install(a);
    if (!s.ok()) return s.status();
    absl::MutexLock lock(&mu);
    serving[static_cast<size_t>(a.self().rank)] = *s;
    return absl::OkStatus();
  });
  ASSERT_NE(agents, nullptr);
  const std::shared_ptr<nn::Module> model = testing::Mlp(5);
  for (int r : {1, 2}) ASSERT_TRUE(serving[r]->Serve({.name = "mnist", .input_shape = {784}}, model, "v7").ok());
  // The endpoint runs on worker 0, which serves nothing itself.
  absl::StatusOr<std::unique_ptr<InferenceEndpoint>> endpoint = InferenceEndpoint::Start(serving[0], "127.0.0.1", 0);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  absl::StatusOr<std::unique_ptr<InferenceClient>> client = InferenceClient::Connect((*endpoint)->address());
  ASSERT_TRUE(client.ok()) << client.status();

  EXPECT_EQ(*(*client)->Health(), "SERVING");
  EXPECT_TRUE(*(*client)->Ready("mnist"));
  EXPECT_FALSE(*(*client)->Ready("nope"));

  Generator gen(3);
  std::set<std::string> replicas;
  for (int i = 0; i < 20; ++i) {
    const Tensor x = Tensor::Randn({1 + i % 3, 784}, gen);
    absl::StatusOr<Prediction> p = (*client)->Predict("mnist", x);
    ASSERT_TRUE(p.ok()) << p.status();
    autograd::NoGradGuard no_grad;
    EXPECT_TRUE(kernels::AllClose(p->output, model->Forward(x), 1e-5, 1e-6));
    EXPECT_EQ(p->version, "v7");
    replicas.insert(p->replica);
  }
  EXPECT_EQ(replicas, (std::set<std::string>{"worker1", "worker2"}));

  // Errors keep their code and message across gRPC.
  absl::StatusOr<Prediction> wrong = (*client)->Predict("mnist", Tensor::Zeros({1, 5}));
  EXPECT_TRUE(absl::IsInvalidArgument(wrong.status())) << wrong.status();
  EXPECT_NE(wrong.status().message().find("expects input [N, 784] float32, got [1, 5] float32"), std::string::npos)
      << wrong.status();
  absl::StatusOr<Prediction> none = (*client)->Predict("nope", Tensor::Zeros({1, 5}));
  EXPECT_TRUE(absl::IsUnavailable(none.status())) << none.status();
  EXPECT_NE(none.status().message().find("no worker serves model 'nope'"), std::string::npos) << none.status();
  absl::StatusOr<Prediction> old = (*client)->Predict("mnist", Tensor::Zeros({1, 784}), absl::Seconds(5), "v6");
  EXPECT_TRUE(absl::IsFailedPrecondition(old.status())) << old.status();

  // A tensor whose data does not match its shape, straight from a raw gRPC stub (as any
  // client could send it): INVALID_ARGUMENT naming both; float_data (not raw bytes) works.
  auto stub = ::gradwire::serve::Inference::NewStub(
      grpc::CreateChannel((*endpoint)->address(), grpc::InsecureChannelCredentials()));
  ::gradwire::serve::PredictRequest req;
  req.set_model("mnist");
  req.mutable_input()->add_shape(2);
  req.mutable_input()->add_shape(784);
  for (int i = 0; i < 5; ++i) req.mutable_input()->add_float_data(1.0f);
  ::gradwire::serve::PredictResponse resp;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = stub->Predict(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("shape [2, 784] float32 needs 1568 elements, the request holds 5"),
              std::string::npos) << s.error_message();
  }
  for (int i = 5; i < 1568; ++i) req.mutable_input()->add_float_data(1.0f);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Predict(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.output().shape_size(), 2);
    EXPECT_EQ(resp.output().raw_data().size(), 2u * 10u * sizeof(float));
    EXPECT_EQ(resp.version(), "v7");
  }

  (*endpoint)->Shutdown();
  EXPECT_FALSE((*client)->Health().ok());
  serving.clear();
  (void)agents->ShutdownAll();
}

}  // namespace
}  // namespace gw::serve
