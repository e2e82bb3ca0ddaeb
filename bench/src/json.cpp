#include <twell/bench/json.hpp>

#include <cmath>
#include <cstdio>

#include <twell/error.hpp>

namespace twell::bench {

namespace {

void write_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void newline(std::string& out, int indent, int depth) {
  if (indent <= 0) return;
  out += '\n';
  out.append(static_cast<std::size_t>(indent * depth), ' ');
}

}  // namespace

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
    write_string(out, *s);
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
      write_string(out, (*o)[k].first);
      out += indent > 0 ? ": " : ":";
      (*o)[k].second.write(out, indent, depth + 1);
    }
    newline(out, indent, depth);
    out += '}';
  }
}

}  // namespace twell::bench
