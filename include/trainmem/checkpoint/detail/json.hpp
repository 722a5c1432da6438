// trainmem/checkpoint/detail/json.hpp — the little JSON a saved plan needs, read strictly.
//
// The library depends on Eigen alone, so a plan file (a small flat object: numbers,
// strings, arrays of objects) is written and read here rather than through a JSON
// library. The reader keeps a number's text, so an integer field is parsed as an exact
// int64 and a real one with std::from_chars (std::to_chars wrote the shortest text that
// reads back to the same double: a round trip is bitwise). It refuses what a plan never
// holds (escapes other than \" \\ \/ \n \t, duplicate keys, trailing text) with a
// trainmem::Error naming the byte where reading stopped.
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "trainmem/error.hpp"

namespace trainmem::detail::json {

/// \brief A parsed JSON value; a number keeps its text.
struct Value {
  enum class Kind : std::uint8_t { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  std::string text;  // a number's text, a string's characters
  std::vector<Value> items;
  std::vector<std::pair<std::string, Value>> members;  // in file order
};

inline const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::Null: return "null";
    case Value::Kind::Bool: return "a boolean";
    case Value::Kind::Number: return "a number";
    case Value::Kind::String: return "a string";
    case Value::Kind::Array: return "an array";
    case Value::Kind::Object: return "an object";
  }
  return "?";
}

/// Recursive-descent reader; `who` names the caller and the source in every Error.
class Reader {
 public:
  Reader(std::string_view text, std::string who) : text_(text), who_(std::move(who)) {}

  Value document() {
    Value v = value(0);
    skip_space();
    fail_unless(pos_ == text_.size(), "text after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 16;

  [[noreturn]] void fail(std::string_view what) const {
    throw Error(concat(who_, ": not a valid plan file: ", what, " at byte ", pos_, " of ", text_.size()));
  }
  void fail_unless(bool ok, std::string_view what) const {
    if (!ok) fail(what);
  }
  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' || text_[pos_] == '\t'))
      ++pos_;
  }
  char peek() {
    skip_space();
    fail_unless(pos_ < text_.size(), "unexpected end of the file (truncated?)");
    return text_[pos_];
  }
  void expect(char c) {
    fail_unless(peek() == c, std::string("expected '") + c + "'");
    ++pos_;
  }
  bool word(std::string_view w) {
    if (text_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }

  Value value(int depth) {
    fail_unless(depth <= kMaxDepth, "nesting deeper than a plan's");
    const char c = peek();
    Value v;
    if (c == '{') {
      v.kind = Value::Kind::Object;
      ++pos_;
      if (peek() == '}') return ++pos_, v;
      for (;;) {
        fail_unless(peek() == '"', "expected a key");
        std::string key = string();
        for (const auto& m : v.members) fail_unless(m.first != key, "duplicate key '" + key + "'");
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Value::Kind::Array;
      ++pos_;
      if (peek() == ']') return ++pos_, v;
      for (;;) {
        v.items.push_back(value(depth + 1));
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Value::Kind::String;
      v.text = string();
      return v;
    }
    if (word("true") || word("false")) {
      v.kind = Value::Kind::Bool;
      v.boolean = text_[pos_ - 1] == 'e' && text_[pos_ - 2] == 'u';
      return v;
    }
    if (word("null")) return v;
    const std::size_t start = pos_;
    while (pos_ < text_.size() && std::string_view("+-.eE0123456789").find(text_[pos_]) != std::string_view::npos)
      ++pos_;
    fail_unless(pos_ > start, "expected a value");
    v.kind = Value::Kind::Number;
    v.text = std::string(text_.substr(start, pos_ - start));
    return v;
  }

  std::string string() {
    ++pos_;  // the opening quote
    std::string out;
    for (;;) {
      fail_unless(pos_ < text_.size(), "unexpected end of the file in a string (truncated?)");
      const char c = text_[pos_++];
      if (c == '"') return out;
      fail_unless(static_cast<unsigned char>(c) >= 0x20, "a control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      fail_unless(pos_ < text_.size(), "unexpected end of the file in a string (truncated?)");
      const char e = text_[pos_++];
      if (e == '"' || e == '\\' || e == '/') out += e;
      else if (e == 'n') out += '\n';
      else if (e == 't') out += '\t';
      else fail("an escape a plan file does not use");
    }
  }

  std::string_view text_;
  std::string who_;
  std::size_t pos_ = 0;
};

/// `text` as one JSON value; `who` names the caller and the source in an Error.
inline Value parse(std::string_view text, const std::string& who) { return Reader(text, who).document(); }

/// A string as JSON text (quotes and escapes).
inline std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else {
      check(static_cast<unsigned char>(c) >= 0x20, "plan file: a string holds control character ", static_cast<int>(c),
            " (only \\n and \\t are written)");
      out += c;
    }
  }
  return out + "\"";
}

/// An integer as JSON text.
inline std::string number(std::int64_t v) { return std::to_string(v); }

/// A finite double as the shortest JSON text that reads back to it bitwise.
inline std::string number(double v, std::string_view field) {
  check(std::isfinite(v), "plan file: field '", field, "' is ", v, ", and JSON has no such number");
  char buffer[64];
  const auto r = std::to_chars(buffer, buffer + sizeof buffer, v);
  return std::string(buffer, r.ptr);
}

/// \brief Strict access to a parsed value: wrong kinds, unknown and missing keys are
/// Errors naming the field by its path ("segments[2].mode").
class Field {
 public:
  Field(const Value& v, std::string path, const std::string* who) : v_(&v), path_(std::move(path)), who_(who) {}

  const std::string& path() const { return path_; }

  [[noreturn]] void fail(std::string_view what) const { throw Error(concat(*who_, ": field '", path_, "' ", what)); }

  /// The object's members, which must be exactly `keys` (any order), and any of `optional`.
  void require_keys(std::initializer_list<std::string_view> keys,
                    std::initializer_list<std::string_view> optional = {}) const {
    kind(Value::Kind::Object);
    for (const auto& m : v_->members) {
      bool known = false;
      for (std::string_view k : keys) known = known || k == m.first;
      for (std::string_view k : optional) known = known || k == m.first;
      if (!known)
        throw Error(concat(*who_, ": unknown field '", child_path(m.first),
                           "' (a plan file of this version has no such field)"));
    }
    for (std::string_view k : keys) (void)at(k);
  }
  /// Whether the object has member `key`.
  bool has(std::string_view key) const {
    kind(Value::Kind::Object);
    for (const auto& m : v_->members)
      if (m.first == key) return true;
    return false;
  }
  Field at(std::string_view key) const {
    kind(Value::Kind::Object);
    for (const auto& m : v_->members)
      if (m.first == key) return Field(m.second, child_path(key), who_);
    throw Error(concat(*who_, ": field '", child_path(key), "' is missing"));
  }
  std::size_t size() const {
    kind(Value::Kind::Array);
    return v_->items.size();
  }
  Field operator[](std::size_t i) const {
    kind(Value::Kind::Array);
    return Field(v_->items[i], concat(path_, "[", i, "]"), who_);
  }
  bool boolean() const {
    kind(Value::Kind::Bool);
    return v_->boolean;
  }
  std::string string() const {
    kind(Value::Kind::String);
    return v_->text;
  }
  std::int64_t integer() const {
    kind(Value::Kind::Number);
    std::int64_t out = 0;
    const std::string& t = v_->text;
    const auto r = std::from_chars(t.data(), t.data() + t.size(), out);
    if (r.ec != std::errc{} || r.ptr != t.data() + t.size()) fail(concat("is ", t, ", expected an integer"));
    return out;
  }
  double real() const {
    kind(Value::Kind::Number);
    double out = 0;
    const std::string& t = v_->text;
    const auto r = std::from_chars(t.data(), t.data() + t.size(), out);
    if (r.ec != std::errc{} || r.ptr != t.data() + t.size()) fail(concat("is ", t, ", expected a number"));
    return out;
  }

 private:
  void kind(Value::Kind k) const {
    if (v_->kind != k) fail(concat("is ", kind_name(v_->kind), ", expected ", kind_name(k)));
  }
  std::string child_path(std::string_view key) const {
    return path_.empty() ? std::string(key) : concat(path_, ".", key);
  }

  const Value* v_;
  std::string path_;
  const std::string* who_;
};

}  // namespace trainmem::detail::json
