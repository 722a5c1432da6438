// trainmem/compiled/cpu_instantiations.hpp — the compiled mode: the CPU backend's common
// instantiations, compiled once in one library instead of in every translation unit.
//
// Header-only means each translation unit that trains instantiates the tape, the ops, the
// optimizers and the Eigen kernels beneath them again (most of its compile time). With
// TRAINMEM_COMPILED=1 (what linking trainmem::compiled sets), trainmem.hpp ends by
// including this file, so each entity below is `extern template`: declared here, compiled
// only in src/cpu_instantiations.cpp, which includes this file a second time with
// TRAINMEM_INSTANTIATE defined as `template`. What is not listed is instantiated where it
// is used, as in header-only mode, so the list can be incomplete but never wrong: an
// entry whose signature drifts from its template fails to compile in that library.
//
// NOTE [Included twice]: no #pragma once, on purpose; see above.
#include "trainmem/trainmem.hpp"  // the templates (a no-op when trainmem.hpp includes this file)

#ifndef TRAINMEM_INSTANTIATE
#define TRAINMEM_INSTANTIATE extern template
#endif

// The backend's element-wise maps, once per library functor (core/math.hpp): each
// instantiates its kernel for every pair (unary) or triple (binary) of floating dtypes,
// so one map<Op> left to a translation unit costs it 16 or 64 kernels.
#define TRAINMEM_CPU_UNARY_MAP(Op)                                                             \
  TRAINMEM_INSTANTIATE void cpu::Backend::map<math::Op>(math::Op, const Tensor<cpu::Backend>&, \
                                                        const Tensor<cpu::Backend>&);
#define TRAINMEM_CPU_BINARY_MAP(Op)                                                            \
  TRAINMEM_INSTANTIATE void cpu::Backend::map<math::Op>(math::Op, const Tensor<cpu::Backend>&, \
                                                        const Tensor<cpu::Backend>&, const Tensor<cpu::Backend>&);

namespace trainmem {

// The backend's maps.
TRAINMEM_CPU_UNARY_MAP(Identity)
TRAINMEM_CPU_UNARY_MAP(Scale)
TRAINMEM_CPU_UNARY_MAP(Relu)
TRAINMEM_CPU_UNARY_MAP(Sigmoid)
TRAINMEM_CPU_UNARY_MAP(Tanh)
TRAINMEM_CPU_UNARY_MAP(Exp)
TRAINMEM_CPU_UNARY_MAP(Log)
TRAINMEM_CPU_UNARY_MAP(Sqrt)
TRAINMEM_CPU_UNARY_MAP(Rsqrt)
TRAINMEM_CPU_UNARY_MAP(Pow)
TRAINMEM_CPU_UNARY_MAP(GeluTanh)
TRAINMEM_CPU_UNARY_MAP(GeluErf)
TRAINMEM_CPU_UNARY_MAP(Silu)
TRAINMEM_CPU_BINARY_MAP(ReluBackward)
TRAINMEM_CPU_BINARY_MAP(SigmoidBackward)
TRAINMEM_CPU_BINARY_MAP(TanhBackward)
TRAINMEM_CPU_BINARY_MAP(ExpBackward)
TRAINMEM_CPU_BINARY_MAP(LogBackward)
TRAINMEM_CPU_BINARY_MAP(SqrtBackward)
TRAINMEM_CPU_BINARY_MAP(RsqrtBackward)
TRAINMEM_CPU_BINARY_MAP(PowBackward)
TRAINMEM_CPU_BINARY_MAP(GeluTanhBackward)
TRAINMEM_CPU_BINARY_MAP(GeluErfBackward)
TRAINMEM_CPU_BINARY_MAP(SiluBackward)
TRAINMEM_CPU_BINARY_MAP(Add)
TRAINMEM_CPU_BINARY_MAP(Sub)
TRAINMEM_CPU_BINARY_MAP(Mul)
TRAINMEM_CPU_BINARY_MAP(Div)
TRAINMEM_CPU_BINARY_MAP(DivBackwardDenominator)
TRAINMEM_CPU_BINARY_MAP(AddScaled)

// Tensors, the tape and what it records.
TRAINMEM_INSTANTIATE class Storage<cpu::Backend>;
TRAINMEM_INSTANTIATE class Tensor<cpu::Backend>;
TRAINMEM_INSTANTIATE class Var<cpu::Backend>;
TRAINMEM_INSTANTIATE class Tape<cpu::Backend>;
TRAINMEM_INSTANTIATE class OpRecorder<cpu::Backend>;
TRAINMEM_INSTANTIATE std::vector<double> Tensor<cpu::Backend>::to_host<double>() const;
TRAINMEM_INSTANTIATE std::vector<float> Tensor<cpu::Backend>::to_host<float>() const;

// Ops.
TRAINMEM_INSTANTIATE Var<cpu::Backend> relu(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> gelu(const Var<cpu::Backend>&, GeluApproximation);
TRAINMEM_INSTANTIATE Var<cpu::Backend> silu(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> swiglu(const Var<cpu::Backend>&, const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> sigmoid(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> tanh(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> exp(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> log(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> sqrt(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> rsqrt(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> pow(const Var<cpu::Backend>&, double);
TRAINMEM_INSTANTIATE Var<cpu::Backend> cast(const Var<cpu::Backend>&, DType);
TRAINMEM_INSTANTIATE Var<cpu::Backend> dropout(const Var<cpu::Backend>&, float, bool);
TRAINMEM_INSTANTIATE Var<cpu::Backend> add(const Var<cpu::Backend>&, const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> sub(const Var<cpu::Backend>&, const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> mul(const Var<cpu::Backend>&, const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> div(const Var<cpu::Backend>&, const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> scale(const Var<cpu::Backend>&, double);
TRAINMEM_INSTANTIATE Var<cpu::Backend> embedding(const Var<cpu::Backend>&, const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> cross_entropy(const Var<cpu::Backend>&, const Tensor<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> matmul(const Var<cpu::Backend>&, const Var<cpu::Backend>&, bool, bool);
TRAINMEM_INSTANTIATE Var<cpu::Backend> bmm(const Var<cpu::Backend>&, const Var<cpu::Backend>&, bool, bool);
TRAINMEM_INSTANTIATE Var<cpu::Backend> linear(const Var<cpu::Backend>&, const Var<cpu::Backend>&,
                                              const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> feed_forward(const Var<cpu::Backend>&, const Var<cpu::Backend>&,
                                                    const Var<cpu::Backend>&, const Var<cpu::Backend>&,
                                                    const Var<cpu::Backend>&, GeluApproximation);
TRAINMEM_INSTANTIATE Var<cpu::Backend> layer_norm(const Var<cpu::Backend>&, const Var<cpu::Backend>&,
                                                  const Var<cpu::Backend>&, double);
TRAINMEM_INSTANTIATE Var<cpu::Backend> rms_norm(const Var<cpu::Backend>&, const Var<cpu::Backend>&, double);
TRAINMEM_INSTANTIATE Var<cpu::Backend> sum(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> mean(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> sum(const Var<cpu::Backend>&, int, bool);
TRAINMEM_INSTANTIATE Var<cpu::Backend> mean(const Var<cpu::Backend>&, int, bool);
TRAINMEM_INSTANTIATE Var<cpu::Backend> slice(const Var<cpu::Backend>&, int, std::int64_t, std::int64_t);
TRAINMEM_INSTANTIATE Var<cpu::Backend> concat(const std::vector<Var<cpu::Backend>>&, int);
TRAINMEM_INSTANTIATE Var<cpu::Backend> reshape(const Var<cpu::Backend>&, Shape);
TRAINMEM_INSTANTIATE Var<cpu::Backend> transpose(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> split_heads(const Var<cpu::Backend>&, std::int64_t);
TRAINMEM_INSTANTIATE Var<cpu::Backend> merge_heads(const Var<cpu::Backend>&, std::int64_t);
TRAINMEM_INSTANTIATE Var<cpu::Backend> causal_mask(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> softmax(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> log_softmax(const Var<cpu::Backend>&);
TRAINMEM_INSTANTIATE Var<cpu::Backend> scaled_dot_product_attention(const Var<cpu::Backend>&, const Var<cpu::Backend>&,
                                                                    const Var<cpu::Backend>&, bool,
                                                                    std::optional<double>);

// Modules.
TRAINMEM_INSTANTIATE class nn::Module<cpu::Backend>;
TRAINMEM_INSTANTIATE class nn::Linear<cpu::Backend>;
TRAINMEM_INSTANTIATE class nn::LayerNorm<cpu::Backend>;
TRAINMEM_INSTANTIATE class nn::Embedding<cpu::Backend>;
TRAINMEM_INSTANTIATE class nn::Mlp<cpu::Backend>;
TRAINMEM_INSTANTIATE class nn::SelfAttention<cpu::Backend>;
TRAINMEM_INSTANTIATE class nn::TransformerBlock<cpu::Backend>;

// Optimizers and mixed precision.
TRAINMEM_INSTANTIATE class optim::Optimizer<cpu::Backend>;
TRAINMEM_INSTANTIATE class optim::SGD<cpu::Backend>;
TRAINMEM_INSTANTIATE class optim::AdamW<cpu::Backend>;
TRAINMEM_INSTANTIATE double optim::clip_grad_norm(const std::vector<Var<cpu::Backend>>&, double);
TRAINMEM_INSTANTIATE double optim::clip_grad_norm(const optim::Optimizer<cpu::Backend>&, double);
TRAINMEM_INSTANTIATE class amp::CastCache<cpu::Backend>;
TRAINMEM_INSTANTIATE class amp::GradScaler<cpu::Backend>;
TRAINMEM_INSTANTIATE class amp::MasterWeights<cpu::Backend>;
TRAINMEM_INSTANTIATE class amp::TrainStep<cpu::Backend>;

// Checkpointing.
TRAINMEM_INSTANTIATE class detail::RegionFrame<cpu::Backend>;
TRAINMEM_INSTANTIATE class detail::ForwardHook<cpu::Backend>;
TRAINMEM_INSTANTIATE class detail::ReplayHook<cpu::Backend>;
TRAINMEM_INSTANTIATE class detail::KeepDecision<cpu::Backend>;
TRAINMEM_INSTANTIATE class detail::KeptOutputs<cpu::Backend>;
TRAINMEM_INSTANTIATE class detail::DeterminismRecord<cpu::Backend>;
TRAINMEM_INSTANTIATE class CheckpointPlan<cpu::Backend>;
TRAINMEM_INSTANTIATE class Planner<cpu::Backend>;
TRAINMEM_INSTANTIATE class ChainRunner<cpu::Backend>;
TRAINMEM_INSTANTIATE ChainProfile profile_chain(const std::vector<Layer<cpu::Backend>>&, const ChainStep<cpu::Backend>&,
                                                cpu::Backend&, int, int, const StageHold&);

}  // namespace trainmem

#undef TRAINMEM_CPU_BINARY_MAP
#undef TRAINMEM_CPU_UNARY_MAP
#undef TRAINMEM_INSTANTIATE
