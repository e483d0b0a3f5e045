#pragma once
// Jinja rendering for chat templates outside the families kvslim renders itself. Debian 12 packages
// no C++ Jinja engine, so templates are rendered by the reference engine, Python's jinja2 (Debian
// package python3-jinja2), in a child process, with the sandbox and options Hugging Face's
// apply_chat_template uses (immutable sandbox, trim_blocks, lstrip_blocks, loop controls,
// raise_exception, tojson, strftime_now), so the text equals what the model's authors rendered.
#include <string>

#include <nlohmann/json.hpp>

namespace kvslim {

/// Renders the Jinja `source` with the variables of `context` (a JSON object: messages, bos_token,
/// eos_token, add_generation_prompt, ...) and returns the text. Runs `$KVSLIM_PYTHON` (default
/// /usr/bin/python3, Debian's, else python3 on PATH) with a time limit of `timeout_s` seconds. Throws kvslim::Error starting with `where`
/// (e.g. "model.gguf: tokenizer.chat_template") when Python or jinja2 is missing, when the template
/// does not parse or raises (its message is quoted), or when rendering runs past the limit.
std::string render_jinja(const std::string& source, const nlohmann::json& context, const std::string& where,
                         double timeout_s = 10.0);

}  // namespace kvslim
