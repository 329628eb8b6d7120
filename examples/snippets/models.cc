// README "Models": layers with PyTorch's names and state dicts, the zoo, safetensors.
// [START include]
#include <gradwire/models/zoo.h>       // models::Create("cnn" | "resnet" | "lstm" | ...)
#include <gradwire/nn/conv.h>          // Conv2d, ...; also normalization.h, recurrent.h, attention.h
#include <gradwire/nn/safetensors.h>   // SaveSafetensors, LoadSafetensors
// [END include]

#include <memory>

#include <gradwire/autograd/engine.h>
#include <gradwire/nn/loss.h>
#include <gradwire/nn/normalization.h>
#include <gradwire/optim/optimizer.h>

namespace snippets::models {

absl::Status Example(const gw::Tensor& images, const gw::Tensor& labels) {
// [START body]

gw::Generator gen(0);
auto conv = gw::nn::Conv2d(1, 32, 3, gen, {.stride = 1, .padding = 1});  // PyTorch's arguments and init
auto norm = gw::nn::BatchNorm2d(32);       // running statistics are buffers in its state dict

// The zoo: the tutorial CNN, a small ResNet, an LSTM over image rows, a ViT.
auto model = *gw::models::Create("resnet", gen);
// Weights trained in PyTorch: torch.save -> safetensors (same keys), loaded and checked.
if (absl::Status s = model->LoadSafetensors("resnet.safetensors"); !s.ok()) return s;  // names a bad key
gw::optim::Optimizer opt(model->Parameters(), gw::optim::Sgd{.lr = 0.05, .momentum = 0.9});
model->Train();                            // batch statistics; Eval() uses the running ones
opt.ZeroGrad();
gw::autograd::Backward({gw::nn::CrossEntropyLoss(model->Forward(images), labels)});
opt.Step();
return model->SaveSafetensors("resnet.safetensors");  // PyTorch and Hugging Face read it
// [END body]
}

}  // namespace snippets::models
