// trainmem/amp/grad_scaler_state.hpp — the loss scaler's settings and its saved state.
//
// Everything a run needs to resume loss scaling where it stopped: the scale, the count
// of clean steps since the last growth or overflow, the overflows the hysteresis still
// tolerates, and the settings. It round-trips exactly through a std::map (keys as in
// PyTorch's GradScaler.state_dict where one exists) and through "key=value" lines,
// whose numbers are written in the shortest form that reads back to the same double.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <system_error>

#include "trainmem/core/loss_scale_rule.hpp"
#include "trainmem/error.hpp"

namespace trainmem::amp {

/// \brief GradScaler settings; the defaults are torch.amp.GradScaler's.
struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int32_t growth_interval = 2000;
  double min_scale = kMinScale;  // backoff floor (DeepSpeed's min_loss_scale); >= the smallest normal f32
  double max_scale = kMaxScale;  // growth ceiling (f32 max: no ceiling)
  std::int32_t hysteresis = 1;   // overflows in a row before a backoff (DeepSpeed); 1: PyTorch
  bool enabled = true;           // false: every method is a no-op, step() just steps
  bool scale_bf16 = false;       // scale even when the autocast dtype is bf16

  /// Validates; `who` names the caller in the message.
  void validate(const char* who) const {
    check_scale(who, "init_scale", init_scale);
    detail::check(growth_factor > 1.0 && std::isfinite(growth_factor), who, ": growth_factor must be > 1, got ",
                  growth_factor);
    detail::check(backoff_factor > 0.0 && backoff_factor < 1.0, who, ": backoff_factor must be in (0, 1), got ",
                  backoff_factor);
    detail::check(growth_interval >= 1, who, ": growth_interval must be >= 1, got ", growth_interval);
    detail::check(hysteresis >= 1, who, ": hysteresis must be >= 1, got ", hysteresis);
    check_scale(who, "min_scale", min_scale);
    check_scale(who, "max_scale", max_scale);
    detail::check(min_scale <= max_scale, who, ": need min_scale <= max_scale, got min_scale ", min_scale,
                  ", max_scale ", max_scale);
    detail::check(init_scale >= min_scale && init_scale <= max_scale, who, ": init_scale ", init_scale,
                  " is outside [min_scale, max_scale] = [", min_scale, ", ", max_scale, "]");
  }

  /// A loss scale must be a normal f32: in [2^-126, f32 max] (0, subnormals and inf are not).
  static void check_scale(const char* who, const char* what, double value) {
    detail::check(value >= kMinScale && value <= kMaxScale, who, ": ", what,
                  " must be in [1.1754944e-38, 3.4028235e38] (the normal f32 range), got ", value);
  }

  ScaleUpdateArgs update_args() const {
    return {static_cast<float>(growth_factor), static_cast<float>(backoff_factor), growth_interval,
            static_cast<float>(min_scale),     static_cast<float>(max_scale),      hysteresis};
  }
};

/// \brief A GradScaler's state: save it with a checkpoint, load it to resume.
struct GradScalerState {
  double scale = 65536.0;
  std::int32_t growth_tracker = 0;   // clean steps since the last growth or overflow
  std::int32_t hysteresis_left = 1;  // overflows still tolerated before a backoff
  GradScalerOptions options;

  bool operator==(const GradScalerState& other) const { return to_map() == other.to_map(); }

  std::map<std::string, double> to_map() const {
    return {{"scale", scale},
            {"growth_factor", options.growth_factor},
            {"backoff_factor", options.backoff_factor},
            {"growth_interval", options.growth_interval},
            {"_growth_tracker", growth_tracker},
            {"min_scale", options.min_scale},
            {"max_scale", options.max_scale},
            {"hysteresis", options.hysteresis},
            {"hysteresis_left", hysteresis_left},
            {"enabled", options.enabled ? 1.0 : 0.0},
            {"scale_bf16", options.scale_bf16 ? 1.0 : 0.0}};
  }

  /// Reads every key to_map writes; a missing key or a value of the wrong kind throws.
  static GradScalerState from_map(const std::map<std::string, double>& values) {
    auto get = [&](const char* key) {
      auto it = values.find(key);
      detail::check(it != values.end(), "GradScalerState::from_map: key '", key, "' is missing");
      return it->second;
    };
    auto get_int = [&](const char* key) {
      const double v = get(key);
      detail::check(v == std::floor(v) && std::fabs(v) < 2147483648.0, "GradScalerState::from_map: '", key,
                    "' must be a 32-bit integer, got ", v);
      return static_cast<std::int32_t>(v);
    };
    GradScalerState state;
    state.scale = get("scale");
    state.growth_tracker = get_int("_growth_tracker");
    state.hysteresis_left = get_int("hysteresis_left");
    state.options.growth_factor = get("growth_factor");
    state.options.backoff_factor = get("backoff_factor");
    state.options.growth_interval = get_int("growth_interval");
    state.options.min_scale = get("min_scale");
    state.options.max_scale = get("max_scale");
    state.options.hysteresis = get_int("hysteresis");
    state.options.enabled = get("enabled") != 0.0;
    state.options.scale_bf16 = get("scale_bf16") != 0.0;
    state.validate("GradScalerState::from_map");
    return state;
  }

  /// Throws unless the settings are valid and the scale and counters are ones a scaler
  /// with them can reach: scale in [min_scale, max_scale] (as f32, the scale's dtype),
  /// growth_tracker in [0, growth_interval), hysteresis_left in [1, hysteresis].
  void validate(const char* who) const {
    GradScalerOptions::check_scale(who, "scale", scale);
    GradScalerOptions checked = options;
    checked.init_scale = options.min_scale;  // the scale takes init_scale's place
    checked.validate(who);
    const float as_f32 = static_cast<float>(scale);
    detail::check(as_f32 >= static_cast<float>(options.min_scale) && as_f32 <= static_cast<float>(options.max_scale),
                  who, ": scale ", scale, " is outside [min_scale, max_scale] = [", options.min_scale, ", ",
                  options.max_scale, "]");
    detail::check(growth_tracker >= 0 && growth_tracker < options.growth_interval, who, ": _growth_tracker ",
                  growth_tracker, " must be in [0, growth_interval = ", options.growth_interval, ")");
    detail::check(hysteresis_left >= 1 && hysteresis_left <= options.hysteresis, who, ": hysteresis_left ",
                  hysteresis_left, " must be in [1, hysteresis = ", options.hysteresis, "]");
  }

  /// "key=value" lines in key order.
  std::string to_string() const {
    std::string out;
    for (const auto& [key, value] : to_map()) {
      char buffer[64];
      const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
      out.append(key).append("=").append(buffer, result.ptr).append("\n");
    }
    return out;
  }

  static GradScalerState from_string(std::string_view text) {
    std::map<std::string, double> values;
    while (!text.empty()) {
      const auto end = text.find('\n');
      const std::string_view line = text.substr(0, end);
      text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
      if (line.empty()) continue;
      const auto eq = line.find('=');
      detail::check(eq != std::string_view::npos, "GradScalerState::from_string: line '", line, "' is not key=value");
      double value = 0;
      const std::string_view number = line.substr(eq + 1);
      const auto result = std::from_chars(number.data(), number.data() + number.size(), value);
      detail::check(result.ec == std::errc{} && result.ptr == number.data() + number.size(),
                    "GradScalerState::from_string: '", number, "' (key '", line.substr(0, eq), "') is not a number");
      values[std::string(line.substr(0, eq))] = value;
    }
    return from_map(values);
  }
};

}  // namespace trainmem::amp
