// The package consumer: trains a linear classifier on four separable points for a few
// SGD steps through the installed trainmem and succeeds only if the loss went down. Built
// twice: header-only, and in the compiled mode (it then says so).
#include <trainmem/trainmem.hpp>

#include <cstdio>
#include <vector>

namespace tmem = trainmem;
using B = tmem::cpu::Backend;

int main() {
  const std::vector<double> points = {1.0, 0.0, 0.9, 0.2, -1.0, 0.1, -0.8, -0.3};
  const std::vector<double> classes = {0, 0, 1, 1};
  const auto labels = tmem::Tensor<B>::from_host(tmem::Shape{4}, classes, tmem::DType::I32);

  tmem::nn::Init init(7);
  tmem::nn::Linear<B> classifier(2, 2, init);
  tmem::optim::SGD<B> sgd(classifier.parameters(), {.lr = 0.5});

  double first_loss = 0.0, last_loss = 0.0;
  for (int step = 0; step < 5; ++step) {
    tmem::Tape<B> tape;
    auto x = tape.input(tmem::Tensor<B>::from_host(tmem::Shape{4, 2}, points));
    auto loss = tmem::cross_entropy(classifier(x), labels);
    const double value = loss.value().to_host<double>().at(0);
    if (step == 0) first_loss = value;
    last_loss = value;
    sgd.zero_grad();
    tape.backward(loss);
    sgd.step();
  }
#if TRAINMEM_COMPILED
  const char* mode = "compiled";
#else
  const char* mode = "header-only";
#endif
  std::printf("trainmem %d.%d.%d consumer (%s): loss %.4f -> %.4f\n", TRAINMEM_VERSION_MAJOR, TRAINMEM_VERSION_MINOR,
              TRAINMEM_VERSION_PATCH, mode, first_loss, last_loss);
  return last_loss < first_loss ? 0 : 1;
}
