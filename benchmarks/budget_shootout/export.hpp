// benchmarks/budget_shootout/export.hpp — a GPT's initial weights for the PyTorch side, in one format.
//
// weights.bin holds every parameter's values as little-endian f32, one after another in
// the model's parameter order; manifest.json names each (name, shape, offset in floats),
// the model's sizes, the folder, the parameter count and whatever the caller adds (the
// text, the window formula, learning rate, steps). torch_side.py's build_model loads it;
// budget_shootout and cuda_vs_pytorch both write it through this one function.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "budget_shootout/gpt.hpp"
#include "trainmem/trainmem.hpp"

namespace shootout {

/// Writes `dir`/weights.bin and `dir`/manifest.json (`extra`'s fields added); returns the parameter count.
template <class B>
std::int64_t export_weights(const std::vector<trainmem::Var<B>>& parameters, const GptSizes& s,
                            const std::filesystem::path& dir, const nlohmann::json& extra) {
  std::filesystem::create_directories(dir);
  nlohmann::json params = nlohmann::json::array();
  std::ofstream weights(dir / "weights.bin", std::ios::binary);
  std::int64_t offset = 0;
  for (const trainmem::Var<B>& p : parameters) {
    const std::vector<float> v = p.value().template to_host<float>();
    weights.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    params.push_back({{"name", p.name()}, {"shape", p.shape().dims()}, {"offset", offset}});
    offset += static_cast<std::int64_t>(v.size());
  }
  weights.close();
  trainmem::require(weights.good(), "export_weights: writing ", (dir / "weights.bin").string(), " failed");
  nlohmann::json manifest = {{"sizes",
                              {{"blocks", s.blocks},
                               {"dim", s.dim},
                               {"heads", s.heads},
                               {"hidden", s.hidden},
                               {"seq", s.seq},
                               {"vocab", s.vocab}}},
                             {"dir", std::filesystem::absolute(dir).string()},
                             {"weights", "weights.bin"},
                             {"params", params},
                             {"parameter_count", offset}};
  manifest.update(extra);
  std::ofstream(dir / "manifest.json") << manifest.dump(2) << "\n";
  return offset;
}

}  // namespace shootout
