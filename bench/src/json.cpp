#include <twell/bench/json.hpp>

#include <cmath>
#include <cstdio>

#include <twell/error.hpp>

namespace twell::bench {

namespace {

// The length of the valid UTF-8 sequence that `s` starts with, or 0 when it starts with none
// (RFC 3629: no overlong forms, no surrogates, nothing beyond U+10FFFF).
std::size_t utf8_sequence_length(std::string_view s) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char second_min = 0x80, second_max = 0xBF;  // narrower after E0, ED, F0 and F4
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;
    if (lead == 0xED) second_max = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < length || byte(1) < second_min || byte(1) > second_max) return 0;
  for (std::size_t i = 2; i < length; ++i)
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  return length;
}

void newline(std::string& out, int indent, int depth) {
  if (indent <= 0) return;
  out += '\n';
  out.append(static_cast<std::size_t>(indent * depth), ' ');
}

}  // namespace

std::string json_quoted(std::string_view text) {
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t length = utf8_sequence_length(text.substr(i));
    i += length == 0 ? 1 : length;
    if (length == 0) {
      out += "\\ufffd";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20) {
      char escaped[7];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out.append(text, i - length, length);
    }
  }
  return out + "\"";
}

Json& Json::operator[](const std::string& key) {
  if (is_null()) value_ = Object{};
  auto* object = std::get_if<Object>(&value_);
  require(object != nullptr, ErrorCode::invalid_argument, "twell::bench::Json::operator[]", "key '", key,
          "' asked of a value that is not an object");
  for (auto& [k, v] : *object)
    if (k == key) return v;
  object->emplace_back(key, Json{});
  return object->back().second;
}

void Json::push_back(Json v) {
  if (is_null()) value_ = Array{};
  auto* array = std::get_if<Array>(&value_);
  require(array != nullptr, ErrorCode::invalid_argument, "twell::bench::Json::push_back", "the value is not an array");
  array->push_back(std::move(v));
}

std::size_t Json::size() const {
  if (const auto* a = std::get_if<Array>(&value_)) return a->size();
  if (const auto* o = std::get_if<Object>(&value_)) return o->size();
  return 0;
}

std::string Json::dump(int indent) const {
  std::string out;
  write(out, indent, 0);
  if (indent > 0) out += '\n';
  return out;
}

void Json::write(std::string& out, int indent, int depth) const {
  if (std::holds_alternative<std::monostate>(value_)) {
    out += "null";
  } else if (const auto* b = std::get_if<bool>(&value_)) {
    out += *b ? "true" : "false";
  } else if (const auto* d = std::get_if<double>(&value_)) {
    if (!std::isfinite(*d)) {
      out += "null";
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", *d);
      out += buf;
    }
  } else if (const auto* i = std::get_if<std::int64_t>(&value_)) {
    out += std::to_string(*i);
  } else if (const auto* s = std::get_if<std::string>(&value_)) {
    out += json_quoted(*s);
  } else if (const auto* a = std::get_if<Array>(&value_)) {
    if (a->empty()) {
      out += "[]";
      return;
    }
    // Arrays of scalars stay on one line so that long result lists remain readable.
    bool flat = true;
    for (const Json& v : *a)
      flat = flat && !std::holds_alternative<Array>(v.value_) && !std::holds_alternative<Object>(v.value_);
    out += '[';
    for (std::size_t k = 0; k < a->size(); ++k) {
      if (k != 0) out += flat ? ", " : ",";
      if (!flat) newline(out, indent, depth + 1);
      (*a)[k].write(out, indent, depth + 1);
    }
    if (!flat) newline(out, indent, depth);
    out += ']';
  } else if (const auto* o = std::get_if<Object>(&value_)) {
    if (o->empty()) {
      out += "{}";
      return;
    }
    out += '{';
    for (std::size_t k = 0; k < o->size(); ++k) {
      if (k != 0) out += ',';
      newline(out, indent, depth + 1);
      out += json_quoted((*o)[k].first);
      out += indent > 0 ? ": " : ":";
      (*o)[k].second.write(out, indent, depth + 1);
    }
    newline(out, indent, depth);
    out += '}';
  }
}

}  // namespace twell::bench
