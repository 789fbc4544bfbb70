#include "cuboid/core/pipeline_layout.hpp"

#include <cctype>
#include <cstdint>
#include <vector>

#include "cuboid/core/error.hpp"

namespace cuboid {

namespace {

// A bound on the unrolled text: 64 K layers is far beyond any model, and it
// keeps "t*999999999" from allocating a gigabyte.
constexpr std::size_t kMaxUnrolled = std::size_t{1} << 16;

const std::string kFix =
    "give Megatron's layout, e.g. \"Et*2|(t*3|)*30,t*2L\": E embedding, t decoder layer, m MTP module, L loss, "
    "| between virtual stages";

struct Reader {
  const std::string& source;
  const std::string& field;
  [[noreturn]] void fail(const std::string& problem, const std::string& fix = kFix) const {
    throw InputError(source, field, problem, fix);
  }
  // The count of a repetition starting at text[i] (a digit), i moved past it.
  std::size_t count(const std::string& text, std::size_t& i) const {
    std::size_t n = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      n = n * 10 + static_cast<std::size_t>(text[i++] - '0');
      if (n > kMaxUnrolled) fail("repetition over " + std::to_string(kMaxUnrolled) + " in the layout");
    }
    return n;
  }
  void append(std::string& out, std::string_view part, std::size_t times) const {
    if (out.size() + part.size() * times > kMaxUnrolled)
      fail("the layout unrolls to over " + std::to_string(kMaxUnrolled) + " characters");
    for (std::size_t k = 0; k < times; ++k) out += part;
  }
};

bool repeat_follows(const std::string& s, std::size_t at) {
  return at + 1 < s.size() && s[at] == '*' && std::isdigit(static_cast<unsigned char>(s[at + 1]));
}

// parse_str_to_list's two re.sub passes, left to right without overlap:
// r'\(([^)]+)\)\*(\d+)' (a group up to the first ")"), then r'(.)\*(\d+)'.
std::string unroll(const std::string& text, const Reader& r) {
  std::string groups;
  std::size_t next_close = 0;  // the first ")" at or after i + 1, found once per ")": linear in the text
  for (std::size_t i = 0; i < text.size();) {
    if (next_close != std::string::npos && next_close < i + 1) next_close = text.find(')', i + 1);
    const std::size_t close = text[i] == '(' ? next_close : std::string::npos;
    if (close != std::string::npos && close > i + 1 && repeat_follows(text, close + 1)) {
      std::size_t at = close + 2;
      const std::size_t n = r.count(text, at);
      r.append(groups, std::string_view(text).substr(i + 1, close - i - 1), n);
      i = at;
    } else {
      r.append(groups, std::string_view(text).substr(i, 1), 1);
      ++i;
    }
  }
  std::string out;
  for (std::size_t i = 0; i < groups.size();) {
    if (groups[i] != '\n' && repeat_follows(groups, i + 1)) {
      std::size_t at = i + 2;
      const std::size_t n = r.count(groups, at);
      r.append(out, std::string_view(groups).substr(i, 1), n);
      i = at;
    } else {
      r.append(out, std::string_view(groups).substr(i, 1), 1);
      ++i;
    }
  }
  return out;
}

}  // namespace

PipelineLayout parse_pipeline_layout(std::string_view text, const std::string& source, const std::string& field) {
  const Reader r{source, field};
  std::string plain;
  for (char c : text)
    if (c != ',') plain += c;
  const std::string unrolled = unroll(plain, r);
  PipelineLayout layout;
  layout.decoders.push_back(0);
  int embeddings = 0, losses = 0;
  bool any_layer = false;
  std::size_t mtp_stage = 0;
  bool after_mtp = false;
  for (const char c : unrolled) {
    const std::size_t stage = layout.decoders.size() - 1;
    if (c != '|' && c != 'L' && losses > 0) r.fail("the layout's last layer must be the loss L");
    switch (c) {
      case '|': layout.decoders.push_back(0); break;
      case 'E':
        if (++embeddings > 1) r.fail("the layout names the embedding E more than once");
        if (any_layer) r.fail("the layout's first layer must be the embedding E");
        break;
      case 'L':
        if (++losses > 1) r.fail("the layout names the loss L more than once");
        break;
      case 't':
        if (after_mtp) r.fail("a decoder layer t after an MTP module m (Megatron places every decoder layer first)");
        ++layout.decoders.back();
        break;
      case 'm':
        if (layout.mtp > 0 && stage != mtp_stage) r.fail("MTP modules m in two virtual stages");
        mtp_stage = stage;
        after_mtp = true;
        ++layout.mtp;
        break;
      default:
        r.fail("invalid layer character " + quote_value(std::string(1, c)) + " in the layout " + quote_value(text));
    }
    if (c != '|' && embeddings == 0) r.fail("the layout's first layer must be the embedding E");
    any_layer = any_layer || c != '|';
  }
  if (losses == 0) r.fail("the layout's last layer must be the loss L");
  if (layout.mtp > 0 && mtp_stage != layout.decoders.size() - 1)
    r.fail("MTP modules m outside the last virtual stage",
           "place the m in the last virtual stage, with the loss: cuboid prices the MTP modules on the last stage");
  return layout;
}

std::string pipeline_layout_string(const PipelineLayout& layout) {
  const std::size_t n = layout.decoders.size();
  auto body = [&](std::size_t vs) {
    const int t = layout.decoders[vs];
    std::string s = vs == 0 ? "E" : "";
    if (t == 1) s += "t";
    if (t > 1) s += "t*" + std::to_string(t);
    if (vs + 1 == n) {
      if (layout.mtp == 1) s += "m";
      if (layout.mtp > 1) s += "m*" + std::to_string(layout.mtp);
      s += "L";
    }
    return s;
  };
  // The first and last virtual stages stand alone; equal ones between them
  // fold as "(body|)*k".
  std::string out;
  for (std::size_t vs = 0; vs < n;) {
    std::size_t run = 1;
    if (vs > 0)
      while (vs + run + 1 < n && layout.decoders[vs + run] == layout.decoders[vs]) ++run;
    if (run > 1) {
      out += "(" + body(vs) + "|)*" + std::to_string(run) + ",";
    } else {
      out += body(vs);
      if (vs + 1 < n) out += "|";
    }
    vs += run;
  }
  return out;
}

}  // namespace cuboid
