// gradwire: the umbrella header. Include this to get the whole public API.
#ifndef GRADWIRE_GRADWIRE_H_
#define GRADWIRE_GRADWIRE_H_

#include "gradwire/tensor/tensor.h"        // Tensor, Generator, DType, Error
#include "gradwire/tensor/kernels.h"       // gw::kernels: math without autograd
#include "gradwire/autograd/functions.h"   // differentiable math and operators
#include "gradwire/autograd/engine.h"      // Backward, Grad, GraphTask
#include "gradwire/autograd/grad_mode.h"   // NoGradGuard
#include "gradwire/nn/module.h"            // Module
#include "gradwire/nn/layers.h"            // Linear, ReLU, Tanh, Sigmoid, Dropout, Sequential
#include "gradwire/nn/embedding.h"         // Embedding, EmbeddingBag
#include "gradwire/nn/loss.h"              // CrossEntropyLoss, MseLoss, Accuracy
#include "gradwire/nn/serialize.h"         // SaveTensors, LoadTensors
#include "gradwire/optim/functional.h"     // Sgd, Adam, AdamW, Adagrad, Update
#include "gradwire/optim/optimizer.h"      // Optimizer
#include "gradwire/data/fashion_mnist.h"   // LoadFashionMnist
#include "gradwire/data/loader.h"          // DataLoader
#include "gradwire/data/progress.h"        // ProgressBar
#include "gradwire/rpc/agent.h"            // Agent, AgentOptions, CallOptions, Future, RRef
#include "gradwire/rpc/faults.h"           // FaultInjector, FaultSpec (fault injection)
#include "gradwire/dist_nn/remote_module.h"  // RemoteModule, RegisterModuleFactory
#include "gradwire/dist_autograd/dist_autograd.h"  // DistAutograd, Context (distributed backward)
#include "gradwire/collectives/collectives.h"  // Collectives, ProcessGroup (allreduce & co.)
#include "gradwire/parallel/distributed_data_parallel.h"  // DistributedDataParallel
#include "gradwire/serve/router.h"          // Serving, Router (batched model serving)
#include "gradwire/serve/follower.h"        // Follower (serve a parameter-server job as it trains)
#include "gradwire/serve/load_generator.h"  // RunLoad (closed / open loop load, latency)
#include "gradwire/worker/launcher.h"      // Launch (gradwire launch)

#endif  // GRADWIRE_GRADWIRE_H_
