// Tokenizers of Hugging Face model directories, chosen by the files present:
//
//   tokenizer.json (byte-level BPE: Llama 3, Qwen2, SmolLM2, GPT-2 style)
//       -> a VocabSpec (model.vocab + added_tokens by id, model.merges, the pre-tokenizer named by
//          its regex) -> Tokenizer::from_vocab. BOS from its post_processor (TemplateProcessing).
//   tokenizer.model (SentencePiece: Llama 2, Mistral, ChatGLM2) -> libsentencepiece encodes each
//       run of text between special tokens; ChatGLM2 (model_type "chatglm") adds THUDM's
//       tokenization_chatglm.py special tokens after the SentencePiece vocabulary ([MASK],
//       [gMASK], [sMASK], sop, eop: 64789.. in the real model) and prefixes [gMASK] sop instead
//       of a BOS token; its chat format is "[Round N]\n\n问：...\n\n答：".
//   vocab.json + merges.txt (GPT-2 slow format: OPT) -> byte-level BPE with the gpt2
//       pre-tokenizer; OPT (model_type "opt") prepends </s> as BOS.
//
// tokenizer.json that is not byte-level (Llama 2's SentencePiece-as-BPE) falls back to
// tokenizer.model. tokenizer_config.json supplies the chat template (or chat_template.jinja),
// bos/eos tokens and add_bos_token; config.json / generation_config.json eos ids also end
// generation.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace fdpp {

struct HfTokenizerHints {
  std::string model_type;              // config.json model_type: "opt" and "chatglm" change defaults
  std::vector<int32_t> eos_token_ids;  // config.json + generation_config.json
  int32_t bos_token_id = -1;
};

// nullptr when the directory has no tokenizer files. Throws fdpp::Error naming the file at fault.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& directory, const HfTokenizerHints& hints = {});

// The pieces, for tests: a byte-level BPE tokenizer.json (+ tokenizer_config.json, may be null)
// as a VocabSpec; throws for a tokenizer.json that is not byte-level BPE or whose pre-tokenizer
// fdpp does not implement.
VocabSpec vocab_from_tokenizer_json(const nlohmann::json& tokenizer, const nlohmann::json* tokenizer_config,
                                    const std::string& origin);

// ChatGLM2's prompt: "[Round i]\n\n问：{user}\n\n答：{assistant}\n\n" per past exchange, then
// "[Round n]\n\n问：{user}\n\n答：" (build_prompt in tokenization_chatglm.py). Roles alternate
// user/assistant from a user message; there is no system role.
std::string render_chatglm2_prompt(std::span<const ChatMessage> messages, bool add_generation_prompt);

}  // namespace fdpp
