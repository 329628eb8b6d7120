// Prediction: what a served model answers to one request.
//
// Contract
//   - output holds the request's rows of the model's output, in the request's order
//     ([rows, ...]); version names the model version that computed every one of them (a
//     batch is computed by one version: a swap never splits a request, serving.h);
//     replica names the worker that computed it (empty when no worker did: Batcher).
//   - It travels as a record (message.h): ValueTraits<Prediction> is defined by Fields().
#ifndef GRADWIRE_SERVE_PREDICTION_H_
#define GRADWIRE_SERVE_PREDICTION_H_

#include <string>
#include <tuple>

#include "gradwire/rpc/message.h"
#include "gradwire/tensor/tensor.h"

namespace gw::serve {

struct Prediction {
  Tensor output;
  std::string version;
  std::string replica;
  static constexpr auto Fields() {
    return std::make_tuple(rpc::Field("output", &Prediction::output), rpc::Field("version", &Prediction::version),
                           rpc::Field("replica", &Prediction::replica));
  }
};

}  // namespace gw::serve

#endif  // GRADWIRE_SERVE_PREDICTION_H_
