// Qwen3's chat format, rendered by fixed C++ code. mxq never executes a checkpoint's Jinja chat_template
// (bad_inputs Q-06, H-18): it does not even read it. Whatever template a checkpoint ships, prompts are built
// here, equal byte for byte to transformers' apply_chat_template with Qwen3's hybrid-thinking template.
// Not supported (refused by the types): tool definitions and assistant tool_calls.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/error.h"

namespace mxq {

// What the CLI and server print once so users know which template applies.
inline constexpr std::string_view kChatTemplateNotice =
    "chat prompts use mxq's built-in Qwen3 template; the checkpoint's chat_template is not executed";

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant only; else parsed out of <think>...</think>
};

struct ChatOptions {
  bool add_generation_prompt = false;
  // Unset renders as transformers does without the argument (thinking on); false appends an empty
  // <think></think> block after the generation prompt.
  std::optional<bool> enable_thinking;
};

// `<|im_start|>role\ncontent<|im_end|>\n` per message, with Qwen3's handling of thinking: reasoning of
// assistant turns before the last user query is dropped, later turns keep it in <think> blocks.
// Errors: no messages, or a role other than the four above (named with its index).
Result<std::string> render_qwen3_chat(std::span<const ChatMessage> messages, const ChatOptions& options);

}  // namespace mxq
