#include "gradwire/models/tutorial_cnn.h"

#include "gradwire/autograd/functions.h"
#include "gradwire/autograd/pooling.h"
#include "gradwire/models/images.h"

namespace gw::models {

TutorialCnn::TutorialCnn(Generator& gen, DType dtype) : Module("TutorialCnn") {
  conv1_ = RegisterModule("conv1", std::make_shared<nn::Conv2d>(1, 32, 3, gen, nn::Conv2dOptions{}, dtype));
  conv2_ = RegisterModule("conv2", std::make_shared<nn::Conv2d>(32, 64, 3, gen, nn::Conv2dOptions{}, dtype));
  dropout1_ = RegisterModule("dropout1", std::make_shared<nn::Dropout2d>(0.25, gen));
  dropout2_ = RegisterModule("dropout2", std::make_shared<nn::Dropout>(0.5, gen));
  fc1_ = RegisterModule("fc1", std::make_shared<nn::Linear>(9216, 128, gen, true, dtype));
  fc2_ = RegisterModule("fc2", std::make_shared<nn::Linear>(128, 10, gen, true, dtype));
}

Tensor TutorialCnn::Forward(const Tensor& images) {
  Tensor x = conv2_->Forward(Relu(conv1_->Forward(AsImages(images, "TutorialCnn"))));
  x = dropout1_->Forward(MaxPool2d(x, Pool2dArgs{.kernel_size = 2}));
  x = dropout2_->Forward(Relu(fc1_->Forward(Flatten(x, 1))));
  return LogSoftmax(fc2_->Forward(x), 1);
}

}  // namespace gw::models
