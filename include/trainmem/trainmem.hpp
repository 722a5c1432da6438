// trainmem/trainmem.hpp — everything for the CPU; include trainmem/cuda.hpp for CUDA.
#pragma once

#include "trainmem/config.hpp"
#include "trainmem/error.hpp"

#include "trainmem/core/dtype.hpp"
#include "trainmem/core/loss_scale_rule.hpp"
#include "trainmem/core/memory_report.hpp"
#include "trainmem/core/memory_stats.hpp"
#include "trainmem/core/rng.hpp"
#include "trainmem/core/stochastic_rounding.hpp"
#include "trainmem/core/tensor.hpp"

#include "trainmem/backend/cpu/backend.hpp"
#include "trainmem/backend/cpu/gemm_path.hpp"
#include "trainmem/backend/cpu/threads.hpp"

#include "trainmem/autograd/grad_mode.hpp"
#include "trainmem/autograd/op_times.hpp"
#include "trainmem/autograd/parameter_list.hpp"
#include "trainmem/autograd/tape.hpp"

#include "trainmem/autocast/op_info.hpp"
#include "trainmem/ops/op_recorder.hpp"

#include "trainmem/ops/activation.hpp"
#include "trainmem/ops/attention.hpp"
#include "trainmem/ops/cast.hpp"
#include "trainmem/ops/dropout.hpp"
#include "trainmem/ops/elementwise.hpp"
#include "trainmem/ops/embedding.hpp"
#include "trainmem/ops/feed_forward.hpp"
#include "trainmem/ops/linear_cross_entropy.hpp"
#include "trainmem/ops/loss.hpp"
#include "trainmem/ops/matmul.hpp"
#include "trainmem/ops/norm.hpp"
#include "trainmem/ops/power.hpp"
#include "trainmem/ops/reduction.hpp"
#include "trainmem/ops/shape.hpp"
#include "trainmem/ops/slice_concat.hpp"
#include "trainmem/ops/softmax.hpp"

#include "trainmem/amp/grad_scaler.hpp"
#include "trainmem/amp/master_weights.hpp"
#include "trainmem/amp/narrowing.hpp"
#include "trainmem/amp/train_step.hpp"
#include "trainmem/autocast/autocast.hpp"
#include "trainmem/autocast/cast_cache.hpp"

#include "trainmem/nn/attention.hpp"
#include "trainmem/nn/embedding.hpp"
#include "trainmem/nn/init.hpp"
#include "trainmem/nn/layer_norm.hpp"
#include "trainmem/nn/linear.hpp"
#include "trainmem/nn/mlp.hpp"
#include "trainmem/nn/module.hpp"
#include "trainmem/nn/rms_norm.hpp"

#include "trainmem/optim/adamw.hpp"
#include "trainmem/optim/clip_grad_norm.hpp"
#include "trainmem/optim/lr_schedule.hpp"
#include "trainmem/optim/sgd.hpp"

#include "trainmem/checkpoint/detail/replay_state.hpp"
#include "trainmem/checkpoint/planner.hpp"
#include "trainmem/checkpoint/policy.hpp"
#include "trainmem/checkpoint/region.hpp"
#include "trainmem/checkpoint/sequential.hpp"

#include "trainmem/state/checksum.hpp"
#include "trainmem/state/file.hpp"
#include "trainmem/state/save.hpp"
#include "trainmem/state/state_dict.hpp"
#include "trainmem/state/stateful.hpp"

// The compiled mode (linking trainmem::compiled sets TRAINMEM_COMPILED=1): the common CPU
// instantiations are extern here and compiled once, in src/cpu_instantiations.cpp.
#if TRAINMEM_COMPILED
#include "trainmem/compiled/cpu_instantiations.hpp"
#endif
