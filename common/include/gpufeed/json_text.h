#pragma once
// The one way gpufeed turns JSON into text: `inspect --json`, `bench --json` and `--dump`, `train
// --metrics` (JSON lines) and `--trace` (Chrome trace), and every other JSON it writes, go through
// json_text().
//
// Policy: a string that is not valid UTF-8 -- on Linux a file name is bytes, and a Latin-1 name
// such as "caf\xE9.jpg" is common on old archives -- is written with each invalid byte replaced by
// U+FFFD, the Unicode replacement character ("caf\uFFFD.jpg", as Python's
// bytes.decode(errors="replace") does), instead of nlohmann::json::dump's default, which throws
// type_error 316 and loses the whole document. Valid UTF-8 is written as is (not \u-escaped).
// The replacement is lossy by design: JSON strings are Unicode, and a document every JSON parser
// reads is worth more than the exact bytes; the text output (`inspect` without --json, logs)
// keeps the raw name.
//
// Header-only, so the rooms that write JSON (tools, harness) share it without a new dependency;
// the includer links nlohmann_json.
#include <nlohmann/json.hpp>
#include <string>

namespace gpufeed {

/// `j` as JSON text: compact when indent < 0, else pretty-printed with `indent` spaces. Invalid
/// UTF-8 in any string becomes U+FFFD (see the policy above); never throws for encoding.
inline std::string json_text(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

}  // namespace gpufeed
