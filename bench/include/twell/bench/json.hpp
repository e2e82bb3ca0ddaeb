// A small JSON value for writing benchmark results (no external dependency; writing only).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace twell::bench {

// `text` as a JSON string literal, valid whatever bytes it holds: quotes and backslashes escaped,
// newline, tab and carriage return as \n, \t and \r, other control characters as \u00XX, and each
// byte that is not part of a valid UTF-8 sequence (a Latin-1 file name) as \ufffd.
std::string json_quoted(std::string_view text);

class Json {
 public:
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;  // keeps insertion order

  Json() = default;  // null
  Json(std::nullptr_t) {}
  Json(bool b) : value_(b) {}
  Json(double d) : value_(d) {}
  Json(int i) : value_(static_cast<std::int64_t>(i)) {}
  Json(std::int64_t i) : value_(i) {}
  Json(std::uint64_t i) : value_(static_cast<std::int64_t>(i)) {}
  Json(std::string s) : value_(std::move(s)) {}
  Json(const char* s) : value_(std::string(s)) {}

  static Json array() { return Json(Array{}); }
  static Json object() { return Json(Object{}); }

  bool is_null() const { return std::holds_alternative<std::monostate>(value_); }
  // Object member, inserted (null) when absent; a null value becomes an object first.
  Json& operator[](const std::string& key);
  // Appends to an array; a null value becomes an array first.
  void push_back(Json v);
  std::size_t size() const;

  // Non-finite numbers are written as null: JSON has no NaN or Inf.
  std::string dump(int indent = 2) const;

 private:
  explicit Json(Array a) : value_(std::move(a)) {}
  explicit Json(Object o) : value_(std::move(o)) {}
  void write(std::string& out, int indent, int depth) const;

  std::variant<std::monostate, bool, double, std::int64_t, std::string, Array, Object> value_;
};

}  // namespace twell::bench
