// tests/compile_fail/borrowed_vectors.cpp — an object that keeps a pointer to a vector argument
// refuses a temporary at compile time.
//
// ChainRunner, Planner and CheckpointPlan keep a pointer to their stages, GradBuckets to its
// parameters and layout. Given a temporary (`ChainRunner run(model.stages(), ...)` with
// stages() returning by value) they compiled and crashed at the first call. Built once per
// TRAINMEM_BORROW_CASE (1 to 5) with TRAINMEM_PASS_TEMPORARY: the build must fail on the
// deleted constructor (CMakeLists.txt checks the diagnostic). Built once without it and
// with TRAINMEM_BORROW_CASE 0, every call with lvalues: that must compile, so a failure
// above is the temporary's and nothing else's.
#include <trainmem/checkpoint/planner.hpp>
#include <trainmem/distributed/grad_buckets.hpp>
#include <trainmem/trainmem.hpp>

#include <vector>

namespace tmem = trainmem;
using B = tmem::cpu::Backend;

struct Model {
  std::vector<tmem::Layer<B>> layers;
  std::vector<tmem::Layer<B>> stages() const { return layers; }  // by value: a temporary
  std::vector<tmem::Var<B>> params;
  std::vector<tmem::Var<B>> parameters() const { return params; }
};

#if defined(TRAINMEM_PASS_TEMPORARY)
#define TRAINMEM_ARG(lvalue, temporary) temporary
#else
#define TRAINMEM_ARG(lvalue, temporary) lvalue
#endif

void borrow(Model& model, tmem::dist::Communicator<B>& comm, const tmem::dist::FlatLayout& layout,
            const tmem::ChainProfile& profile) {
  const std::vector<tmem::Layer<B>> stages = model.stages();
  const std::vector<tmem::Var<B>> params = model.parameters();
  const std::vector<tmem::Segment> segments = {{0, 1, tmem::StageMode::Keep}};
  (void)comm, (void)layout, (void)profile, (void)params, (void)segments;
#if !defined(TRAINMEM_PASS_TEMPORARY) && TRAINMEM_BORROW_CASE == 0
#define TRAINMEM_BORROW(c) 1
#else
#define TRAINMEM_BORROW(c) (TRAINMEM_BORROW_CASE == c)
#endif
#if !(TRAINMEM_BORROW_CASE >= 0 && TRAINMEM_BORROW_CASE <= 5)
#error "TRAINMEM_BORROW_CASE must be 0 (all, with lvalues) or 1 to 5"
#endif
#if TRAINMEM_BORROW(1)
  tmem::ChainRunner<B> run(TRAINMEM_ARG(stages, model.stages()), segments);
#endif
#if TRAINMEM_BORROW(2)
  tmem::Planner<B> planner(TRAINMEM_ARG(stages, model.stages()), [](const tmem::ChainRunner<B>&) {});
#endif
#if TRAINMEM_BORROW(3)
  tmem::CheckpointPlan<B> plan(TRAINMEM_ARG(stages, model.stages()), segments, {}, {}, profile);
#endif
#if TRAINMEM_BORROW(4)
  tmem::dist::GradBuckets<B> buckets(comm, TRAINMEM_ARG(params, model.parameters()), layout, 1024, 2);
#endif
#if TRAINMEM_BORROW(5)
  tmem::dist::GradBuckets<B> buckets_of_layout(comm, params, TRAINMEM_ARG(layout, tmem::dist::FlatLayout(layout)), 1024,
                                               2);
#endif
}
