#include "io/chat_template.h"

namespace mxq {
namespace {

// Python's str.lstrip('\n') / rstrip('\n') / strip('\n'), as the template applies them.
std::string_view lstrip_nl(std::string_view s) {
  const size_t b = s.find_first_not_of('\n');
  return b == std::string_view::npos ? std::string_view() : s.substr(b);
}
std::string_view rstrip_nl(std::string_view s) {
  const size_t e = s.find_last_not_of('\n');
  return e == std::string_view::npos ? std::string_view() : s.substr(0, e + 1);
}
std::string_view strip_nl(std::string_view s) { return rstrip_nl(lstrip_nl(s)); }

// s.split(sep)[0] and s.split(sep)[-1]: the text before the first and after the last separator.
std::string_view before_first(std::string_view s, std::string_view sep) {
  const size_t p = s.find(sep);
  return p == std::string_view::npos ? s : s.substr(0, p);
}
std::string_view after_last(std::string_view s, std::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

bool is_tool_response(std::string_view s) {
  return s.starts_with("<tool_response>") && s.ends_with("</tool_response>");
}

}  // namespace

// Follows the Jinja template statement by statement (tools branch aside), so a diff against Qwen's template
// text maps onto this function. A system message is only special in position 0; later ones render as turns.
Result<std::string> render_qwen3_chat(std::span<const ChatMessage> messages, const ChatOptions& options) {
  if (messages.empty()) return fail("chat: no messages to render");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      return fail("chat: message {} has role '{}', expected system, user, assistant or tool", i, r);
    }
  }
  const size_t n = messages.size();
  std::string out;
  if (messages[0].role == "system") out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";

  // The last user turn that is a real query (not tool output echoed as a user turn); reasoning is kept only
  // for assistant turns after it. note: n - 1 when there is none, so no turn keeps reasoning.
  size_t last_query = n - 1;
  for (size_t k = n; k-- > 0;) {
    if (messages[k].role == "user" && !is_tool_response(messages[k].content)) {
      last_query = k;
      break;
    }
  }

  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (content.find("</think>") != std::string_view::npos) {
        reasoning = lstrip_nl(after_last(rstrip_nl(before_first(content, "</think>")), "<think>"));
        content = lstrip_nl(after_last(content, "</think>"));
      }
      out += "<|im_start|>assistant\n";
      if (i > last_query && (i == n - 1 || !reasoning.empty())) {
        out += "<think>\n";
        out += strip_nl(reasoning);
        out += "\n</think>\n\n";
        out += lstrip_nl(content);
      } else {
        out += content;
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      // note: consecutive tool messages share one user turn, each in its own <tool_response> block.
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i == n - 1 || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (options.enable_thinking == false) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace mxq
