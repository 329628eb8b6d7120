// gradwire: the umbrella header. Include this to get the whole public API: every public
// header under <folder>/include/gradwire/<folder>/, layer by layer, bottom up (DESIGN.md).
// Link the CMake target gradwire::gradwire, which links every layer's library.
//
// Nothing is left out. The headers marked "for layer authors" are public because the
// layers above rpc/ (and gradwire's own tests) build on them; an application rarely
// names them directly. Everything else a program may use.
// examples/snippets/umbrella.cc includes nothing but this header and names a type of every
// layer, so it fails to compile when a layer is missing here; the README's first program
// (examples/snippets/first_program/) includes only this header too.
#ifndef GRADWIRE_GRADWIRE_H_
#define GRADWIRE_GRADWIRE_H_

// tensor/: tensors and the math that never records autograd.
#include "gradwire/tensor/allocator.h"     // Allocator, the caching CPU allocator
#include "gradwire/tensor/attention.h"     // fused multi-head attention kernels
#include "gradwire/tensor/convolution.h"   // convolution kernels (oneDNN), Size2, Conv2dArgs
#include "gradwire/tensor/cuda.h"          // gw::cuda: GPUs, streams, their memory
#include "gradwire/tensor/device.h"        // Device
#include "gradwire/tensor/device_allocator.h"  // CachingDeviceAllocator (GPU memory)
#include "gradwire/tensor/dtype.h"         // DType
#include "gradwire/tensor/error.h"         // gw::Error (shape, dtype and index errors)
#include "gradwire/tensor/generator.h"     // Generator (seeded; no hidden global RNG)
#include "gradwire/tensor/kernels.h"       // gw::kernels: math without autograd
#include "gradwire/tensor/normalization.h" // batch / layer / group norm kernels
#include "gradwire/tensor/pooling.h"       // max / average / adaptive pooling kernels
#include "gradwire/tensor/recurrent.h"     // LSTM / GRU layer kernels
#include "gradwire/tensor/shape.h"         // Shape
#include "gradwire/tensor/storage.h"       // Storage
#include "gradwire/tensor/tensor.h"        // Tensor
#include "gradwire/tensor/vector_math.h"   // vectorisable float exp/tanh (for kernel authors)

// autograd/: the local engine.
#include "gradwire/autograd/accumulate_grad.h"  // AccumulateGrad (for layer authors)
#include "gradwire/autograd/attention.h"  // fused multi-head attention
#include "gradwire/autograd/convolution.h"  // differentiable Conv1d / Conv2d / ConvTranspose2d
#include "gradwire/autograd/engine.h"      // Backward, Grad, GraphTask
#include "gradwire/autograd/function.h"    // recording a differentiable op (for layer authors)
#include "gradwire/autograd/functions.h"   // differentiable math and operators
#include "gradwire/autograd/grad_hooks.h"  // post-accumulate gradient hooks
#include "gradwire/autograd/grad_mode.h"   // NoGradGuard
#include "gradwire/autograd/gradcheck.h"   // GradCheck (finite differences)
#include "gradwire/autograd/node.h"        // Node, Edge (for layer authors)
#include "gradwire/autograd/normalization.h"  // differentiable BatchNorm / LayerNorm / GroupNorm
#include "gradwire/autograd/pooling.h"     // differentiable pooling
#include "gradwire/autograd/recurrent.h"   // differentiable LSTM / GRU layers

// nn/, optim/, data/: models, optimizers, datasets.
#include "gradwire/data/fashion_mnist.h"      // LoadFashionMnist
#include "gradwire/data/loader.h"             // DataLoader
#include "gradwire/data/progress.h"           // ProgressBar
#include "gradwire/data/summary_writer.h"     // SummaryWriter: TensorBoard event files
#include "gradwire/models/images.h"           // AsImages: the zoo's image input
#include "gradwire/models/lstm_classifier.h"  // LstmClassifier
#include "gradwire/models/resnet.h"           // SmallResNet, BasicBlock
#include "gradwire/models/tutorial_cnn.h"     // TutorialCnn (PyTorch's parameter-server tutorial)
#include "gradwire/models/vit.h"              // SmallViT
#include "gradwire/models/zoo.h"              // models::Create by name
#include "gradwire/nn/attention.h"            // MultiheadAttention
#include "gradwire/nn/conv.h"                 // Conv1d, Conv2d, ConvTranspose2d
#include "gradwire/nn/embedding.h"            // Embedding, EmbeddingBag
#include "gradwire/nn/layers.h"               // Linear, activations, Dropout(2d), Flatten, Sequential
#include "gradwire/nn/loss.h"                 // NllLoss, CrossEntropyLoss, MseLoss, Accuracy
#include "gradwire/nn/module.h"               // Module
#include "gradwire/nn/normalization.h"        // BatchNorm1d / 2d, LayerNorm, GroupNorm
#include "gradwire/nn/pooling.h"              // MaxPool2d, AvgPool2d, AdaptiveAvgPool2d
#include "gradwire/nn/recurrent.h"            // LSTM, GRU
#include "gradwire/nn/safetensors.h"          // SaveSafetensors, LoadSafetensors
#include "gradwire/nn/serialize.h"            // SaveTensors, LoadTensors (the .gwtf format)
#include "gradwire/nn/transformer.h"          // TransformerEncoderLayer, TransformerEncoder
#include "gradwire/optim/functional.h"        // Sgd, Adam, AdamW, Adagrad, Update
#include "gradwire/optim/optimizer.h"         // Optimizer

// rpc/: agents, remote calls, RRefs.
#include "gradwire/rpc/agent.h"            // Agent, AgentOptions, CallOptions
#include "gradwire/rpc/call_hooks.h"       // CallHooks (for layer authors)
#include "gradwire/rpc/device_map.h"       // DeviceMap: where GPU tensors sent to a peer arrive
#include "gradwire/rpc/errors.h"           // the failure model's errors, IsRetryable
#include "gradwire/rpc/executor.h"         // Executor, ThreadPool
#include "gradwire/rpc/faults.h"           // FaultInjector, FaultSpec (fault injection)
#include "gradwire/rpc/frame.h"            // frames on the wire (for layer authors)
#include "gradwire/rpc/future.h"           // Future, Promise
#include "gradwire/rpc/global_id.h"        // GlobalId
#include "gradwire/rpc/message.h"          // typed messages, records (Field, Fields())
#include "gradwire/rpc/metrics_endpoint.h"  // MetricsEndpoint: Prometheus' text format over HTTP
#include "gradwire/rpc/retry.h"            // RetryPolicy, Retry
#include "gradwire/rpc/rref.h"             // RRef
#include "gradwire/rpc/security.h"         // Security: job secret, TLS, limits
#include "gradwire/rpc/statistics.h"       // Statistics, ToText (Prometheus text format)
#include "gradwire/rpc/store.h"            // Store, ConnectStore (rendezvous, etcd)
#include "gradwire/rpc/timer_queue.h"      // TimerQueue
#include "gradwire/rpc/transport.h"        // Transport, Connection (for layer authors)
#include "gradwire/rpc/value.h"            // Value, the types calls may carry

// Model parallelism and distributed autograd.
#include "gradwire/dist_nn/remote_module.h"  // RemoteModule, RegisterModuleFactory
#include "gradwire/dist_autograd/dist_autograd.h"  // DistAutograd, Context (distributed backward)
#include "gradwire/dist_autograd/distributed_optimizer.h"  // DistributedOptimizer

// Collectives, data parallelism and pipelines.
#include "gradwire/collectives/collectives.h"    // Collectives (installed per agent)
#include "gradwire/collectives/process_group.h"  // ProcessGroup: allreduce & co.
#include "gradwire/collectives/reduce_op.h"      // ReduceOp
#include "gradwire/parallel/data_parallel.h"     // DataParallel (several GPUs of one process)
#include "gradwire/parallel/distributed_data_parallel.h"  // DistributedDataParallel
#include "gradwire/parallel/pipeline.h"    // Pipeline (GPipe, 1F1B), ServeStageReplicas

// Parameter servers.
#include "gradwire/param_server/client.h"  // Client: a trainer's view of the servers
#include "gradwire/param_server/reader.h"  // Reader: tables read by processes that do not train
#include "gradwire/param_server/row_store.h"  // RowStore: a sparse shard's rows
#include "gradwire/param_server/server.h"  // ParameterServer (the server role)
#include "gradwire/param_server/sharding.h"  // which server holds which part of a table
#include "gradwire/param_server/sparse_embedding.h"  // SparseEmbedding (hybrid jobs)

// Serving.
#include "gradwire/serve/batcher.h"        // Batcher (dynamic batching)
#include "gradwire/serve/follower.h"       // Follower, ServeCheckpoint
#include "gradwire/serve/inference_endpoint.h"  // InferenceEndpoint, InferenceClient (gRPC)
#include "gradwire/serve/load_generator.h"  // RunLoad (closed / open loop load, latency)
#include "gradwire/serve/model_stats.h"    // ModelStats
#include "gradwire/serve/prediction.h"     // Prediction
#include "gradwire/serve/router.h"         // Router
#include "gradwire/serve/serving.h"        // Serving (models hosted per worker)

// worker/: the launcher behind `gradwire launch`.
#include "gradwire/worker/launcher.h"      // Launch

#endif  // GRADWIRE_GRADWIRE_H_
