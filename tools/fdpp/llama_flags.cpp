// The table of llama.cpp's (and vLLM's) multi-letter single-dash flags and the command-line rewrite
// that applies it (llama_flags.h). Spellings and long names are llama.cpp's common/arg.cpp.
#include "llama_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "cli_common.h"

namespace fdpp::cli {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// -ngl all / auto (llama.cpp's newer spellings): every layer, which is what a GPU run does here.
ForeignDecision gpu_layers(std::string_view v) {
  const std::string l = lower(v);
  if (l == "all" || l == "auto") return {ForeignAction::Alias, "999"};
  return {ForeignAction::Alias, std::string(v)};
}

// -dev none / CPU / CUDA0: the device; several devices or another GPU are said to be done otherwise.
ForeignDecision device_list(std::string_view v) {
  const std::string l = lower(v);
  if (l == "none" || l == "cpu") return {ForeignAction::Alias, "cpu"};
  if (l == "cuda" || l == "cuda0") return {ForeignAction::Alias, "cuda"};
  if (l.find(',') != std::string::npos)
    return {ForeignAction::Refuse, "one model over several GPUs is --tensor-parallel N here"};
  if (l.starts_with("cuda"))
    return {ForeignAction::Refuse, "fdpp runs on the first visible GPU; choose another with CUDA_VISIBLE_DEVICES"};
  return {ForeignAction::Refuse, "the devices here are none (the CPU) and CUDA0"};
}

ForeignDecision main_gpu(std::string_view v) {
  if (v == "0") return {ForeignAction::Ignore, "fdpp runs on the first visible GPU"};
  return {ForeignAction::Refuse, "fdpp runs on the first visible GPU; choose another with CUDA_VISIBLE_DEVICES"};
}

ForeignDecision kv_cache_type(std::string_view v) {
  const std::string l = lower(v);
  if (l == "f16" || l == "bf16" || l == "f32")
    return {ForeignAction::Ignore,
            "the KV cache takes the weights' dtype on the GPU and fp32 on the CPU (--kv-cache-dtype f16 for f16)"};
  return {ForeignAction::Refuse,
          "quantized KV caches are not supported (the cache is f16/bf16 on the GPU, f32 or f16 on the CPU; "
          "--kv-cache-dtype fp8 gives an e4m3 cache on the GPU)"};
}

constexpr std::string_view kDraft = "speculative decoding (a draft model) is not supported";
constexpr std::string_view kDownload = "fdpp downloads nothing: give -m with a local GGUF file or HF directory";
constexpr std::string_view kSplit = "fdpp does not split a model's tensors between the CPU and a GPU";
constexpr std::string_view kTrain = "fdpp runs inference only (no fine-tuning or imatrix)";
constexpr std::string_view kBatchedBench = "llama-batched-bench's flag; fdpp bench takes -p, -b and -c";
constexpr std::string_view kThreads = "CPU affinity is the OS's here (taskset); --threads sets the count";

using A = ForeignAction;
using V = ForeignValue;

const std::vector<ForeignFlag> kTable = {
    // Conversation (fdpp generate's interactive chat).
    {"-cnv", "--conversation", V::None, A::Alias, "--conversation"},
    {"-no-cnv", "--no-conversation", V::None, A::Alias, "--no-conversation"},
    {"-st", "--single-turn", V::None, A::Alias, "--single-turn"},
    {"-mli", "--multiline-input", V::None, A::Alias, "--multiline-input"},
    {"-sys", "--system-prompt", V::Required, A::Alias, "--system-prompt"},
    {"-sysf", "--system-prompt-file", V::Required, A::Alias, "--system-prompt-file"},
    {"-co", "--color", V::Optional, A::Alias, "--color"},
    {"-if", "--interactive-first", V::None, A::Refuse,
     "fdpp's -i/-cnv chat waits for input first unless -p gives the first message"},
    {"-sp", "--special", V::None, A::Refuse, "special tokens are never printed by fdpp generate"},
    {"-rea", "--reasoning", V::Required, A::Refuse, "reasoning on/off is not supported"},
    {"-bf", "--binary-file", V::Required, A::Refuse, "give the prompt with -p or --file"},
    {"-ptc", "--print-token-count", V::Required, A::Ignore, "the token counts are printed after each reply"},
    {"-jf", "--json-schema-file", V::Required, A::Refuse, "JSON schema constraints are not in the CLI"},
    {"-bs", "--backend-sampling", V::None, A::Ignore, "fdpp samples on the device that runs the model"},
    {"-gan", "--grp-attn-n", V::Required, A::Refuse, "group attention (self-extend) is not supported"},
    {"-gaw", "--grp-attn-w", V::Required, A::Refuse, "group attention (self-extend) is not supported"},
    {"-lcs", "--lookup-cache-static", V::Required, A::Refuse, "lookup decoding is not supported"},
    {"-lcd", "--lookup-cache-dynamic", V::Required, A::Refuse, "lookup decoding is not supported"},
    // Devices and memory.
    {"-ngl", "--n-gpu-layers", V::Required, A::Alias, "--n-gpu-layers", gpu_layers,
     "every layer runs on the device that runs the model"},
    {"-dev", "--device", V::Required, A::Alias, "--device", device_list},
    {"-tp", "--tensor-parallel-size", V::Required, A::Alias, "--tensor-parallel"},  // vLLM's
    {"-sm", "--split-mode", V::Required, A::Ignore,
     "fdpp splits a model over GPUs by tensor parallelism (--tensor-parallel N)"},
    {"-ts", "--tensor-split", V::Required, A::Ignore, "--tensor-parallel N splits a model evenly over N GPUs"},
    {"-mg", "--main-gpu", V::Required, A::Ignore, "", main_gpu},
    {"-fa", "--flash-attn", V::Optional, A::Ignore, "fdpp's attention kernels are always fused (flash) ones"},
    {"-ctk", "--cache-type-k", V::Required, A::Ignore, "", kv_cache_type},
    {"-ctv", "--cache-type-v", V::Required, A::Ignore, "", kv_cache_type},
    {"-nkvo", "--no-kv-offload", V::None, A::Ignore, "the KV cache stays on the device that runs the model"},
    {"-kvo", "--kv-offload", V::None, A::Ignore, "the KV cache is on the device that runs the model"},
    {"-kvu", "--kv-unified", V::None, A::Ignore, "the KV cache is one pool of blocks shared by every sequence"},
    {"-no-kvu", "--no-kv-unified", V::None, A::Ignore, "the KV cache is one pool of blocks shared by every sequence"},
    {"-ot", "--override-tensor", V::Required, A::Refuse, kSplit},
    {"-cmoe", "--cpu-moe", V::None, A::Refuse, kSplit},
    {"-ncmoe", "--n-cpu-moe", V::Required, A::Refuse, kSplit},
    {"-fit", "--fit", V::Required, A::Ignore, "the KV cache is sized from free memory (--gpu-memory-utilization)"},
    {"-fitt", "--fit-target", V::Required, A::Ignore,
     "the KV cache is sized from free memory (--gpu-memory-utilization)"},
    {"-fitc", "--fit-ctx", V::Required, A::Ignore, "the KV cache is sized from free memory (--gpu-memory-utilization)"},
    {"-fitp", "--fit-print", V::Required, A::Ignore, "fdpp info prints what a model needs"},
    {"-dio", "--direct-io", V::None, A::Ignore, "weights are read through mmap or streamed to the GPU"},
    {"-ndio", "--no-direct-io", V::None, A::Ignore, "weights are read through mmap or streamed to the GPU"},
    {"-mmp", "--mmap", V::Required, A::Ignore, "weights are read through mmap or streamed to the GPU"},  // llama-bench
    {"-nr", "--no-repack", V::None, A::Ignore, "the CPU repacks GGUF blocks at load without a second copy (--cpu-weights)"},
    {"-cram", "--cache-ram", V::Required, A::Ignore, "fdpp keeps no prompt cache in host memory"},
    {"-ctxcp", "--ctx-checkpoints", V::Required, A::Ignore, "fdpp keeps no context checkpoints"},
    {"-cms", "--checkpoint-min-step", V::Required, A::Ignore, "fdpp keeps no context checkpoints"},
    {"-dt", "--defrag-thold", V::Required, A::Ignore, "the paged KV cache needs no defragmentation"},
    // Threads and batching.
    {"-tb", "--threads-batch", V::Required, A::Ignore, "--threads serves prompt processing too"},
    {"-Cr", "--cpu-range", V::Required, A::Ignore, kThreads},
    {"-Cb", "--cpu-mask-batch", V::Required, A::Ignore, kThreads},
    {"-Crb", "--cpu-range-batch", V::Required, A::Ignore, kThreads},
    {"-ub", "--ubatch-size", V::Required, A::Ignore, "a step's tokens are --max-batched-tokens"},
    {"-np", "--parallel", V::Required, A::Alias, "--max-num-seqs"},
    {"-cb", "--cont-batching", V::None, A::Ignore, "continuous batching is always on"},
    {"-nocb", "--no-cont-batching", V::None, A::Ignore, "continuous batching is always on"},
    {"-sps", "--slot-prompt-similarity", V::Required, A::Ignore, "fdpp serve has no slots"},
    {"-to", "--timeout", V::Required, A::Ignore, "fdpp serve has no read/write timeout"},
    {"-lv", "--verbosity", V::Required, A::Ignore, "fdpp has no log levels (--quiet drops the load lines)"},
    // Models fdpp does not fetch or use.
    {"-hf", "--hf-repo", V::Required, A::Refuse, kDownload},
    {"-hfr", "--hf-repo", V::Required, A::Refuse, kDownload},
    {"-hff", "--hf-file", V::Required, A::Refuse, kDownload},
    {"-hft", "--hf-token", V::Required, A::Refuse, kDownload},
    {"-hfv", "--hf-repo-v", V::Required, A::Refuse, kDownload},
    {"-hfrv", "--hf-repo-v", V::Required, A::Refuse, kDownload},
    {"-hffv", "--hf-file-v", V::Required, A::Refuse, kDownload},
    {"-mu", "--model-url", V::Required, A::Refuse, kDownload},
    {"-dr", "--docker-repo", V::Required, A::Refuse, kDownload},
    {"-cl", "--cache-list", V::None, A::Refuse, "fdpp keeps one default model; -m names any other"},
    {"-mm", "--mmproj", V::Required, A::Refuse, "multimodal projectors are not supported"},
    {"-mmu", "--mmproj-url", V::Required, A::Refuse, "multimodal projectors are not supported"},
    {"-mv", "--model-vocoder", V::Required, A::Refuse, "vocoders are not supported"},
    {"-md", "--model-draft", V::Required, A::Refuse, kDraft},
    {"-ngld", "--n-gpu-layers-draft", V::Required, A::Refuse, kDraft},
    {"-devd", "--device-draft", V::Required, A::Refuse, kDraft},
    {"-ctkd", "--cache-type-k-draft", V::Required, A::Refuse, kDraft},
    {"-ctvd", "--cache-type-v-draft", V::Required, A::Refuse, kDraft},
    {"-td", "--threads-draft", V::Required, A::Refuse, kDraft},
    {"-tbd", "--threads-batch-draft", V::Required, A::Refuse, kDraft},
    {"-otd", "--override-tensor-draft", V::Required, A::Refuse, kDraft},
    {"-cmoed", "--cpu-moe-draft", V::None, A::Refuse, kDraft},
    {"-ncmoed", "--n-cpu-moe-draft", V::Required, A::Refuse, kDraft},
    {"-hfd", "--hf-repo-draft", V::Required, A::Refuse, kDraft},
    {"-hfrd", "--hf-repo-draft", V::Required, A::Refuse, kDraft},
    // Other llama.cpp tools.
    {"-npp", "-npp", V::Required, A::Refuse, kBatchedBench},
    {"-ntg", "-ntg", V::Required, A::Refuse, kBatchedBench},
    {"-npl", "-npl", V::Required, A::Refuse, kBatchedBench},
    {"-pps", "-pps", V::None, A::Refuse, kBatchedBench},
    {"-tgs", "-tgs", V::None, A::Refuse, kBatchedBench},
    {"-ns", "--sequences", V::Required, A::Refuse, "llama-parallel's flag; fdpp generate --file runs a batch"},
    {"-ofreq", "--output-frequency", V::Required, A::Refuse, kTrain},
    {"-opt", "--optimizer", V::Required, A::Refuse, kTrain},
    {"-lr", "--learning-rate", V::Required, A::Refuse, kTrain},
    {"-lr-min", "--learning-rate-min", V::Required, A::Refuse, kTrain},
    {"-wd", "--weight-decay", V::Required, A::Refuse, kTrain},
    {"-epochs", "--epochs", V::Required, A::Refuse, kTrain},
    {"-decay-epochs", "--learning-rate-decay-epochs", V::Required, A::Refuse, kTrain},
    {"-val-split", "--val-split", V::Required, A::Refuse, kTrain},
};

bool optional_value_word(std::string_view w) {
  const std::string l = lower(w);
  return l == "on" || l == "off" || l == "auto" || l == "true" || l == "false" || l == "1" || l == "0";
}

// "-n128", "-c4096", "-s-1": a one-letter flag with its value attached (CLI11 reads these).
bool attached_number(std::string_view rest) {
  if (rest.starts_with('-')) rest.remove_prefix(1);
  return !rest.empty() && std::all_of(rest.begin(), rest.end(),
                                      [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; });
}

}  // namespace

const std::vector<ForeignFlag>& foreign_flags() { return kTable; }

const ForeignFlag* find_foreign_flag(std::string_view spelling) {
  for (const ForeignFlag& f : kTable)
    if (f.spelling == spelling) return &f;
  return nullptr;
}

RewrittenArgs rewrite_foreign_flags(const std::vector<std::string>& args, const FlagLookup& lookup) {
  RewrittenArgs r;
  bool value_next = false;  // the word before was a flag that takes a value
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (value_next || word == "--" || word.size() < 2 || word[0] != '-') {
      r.args.push_back(word);
      value_next = false;
      if (word == "--") r.args.insert(r.args.end(), args.begin() + static_cast<long>(i) + 1, args.end());
      if (word == "--") break;
      continue;
    }
    const size_t eq = word.find('=');
    const std::string name = word.substr(0, eq);
    const bool attached = eq != std::string::npos;
    if (name.starts_with("--") || name.size() == 2 || !std::isalpha(static_cast<unsigned char>(name[1]))) {
      r.args.push_back(word);  // fdpp's own spelling (or a negative number as a value)
      value_next = !attached && lookup.known(name) && lookup.takes_value(name);
      continue;
    }
    const ForeignFlag* f = find_foreign_flag(name);
    if (f == nullptr) {
      const std::string letter = name.substr(0, 2);
      if (lookup.known(letter) && lookup.takes_value(letter) && !attached && attached_number(name.substr(2))) {
        r.args.push_back(word);
        continue;
      }
      throw UsageError(
          fmt::format("{}: not a flag here; fdpp's single-dash flags are one letter, and the "
                      "llama.cpp flags it takes are listed in the README",
                      name));
    }
    // The value, attached ("-ngl=99"), the next word, or none.
    std::string value;
    bool has_value = false;
    if (f->value == ForeignValue::Required) {
      if (attached) {
        value = word.substr(eq + 1);
      } else {
        if (i + 1 >= args.size()) throw UsageError(fmt::format("{} ({}): needs a value", name, f->long_name));
        value = args[++i];
      }
      has_value = true;
    } else if (f->value == ForeignValue::Optional) {
      if (attached) {
        value = word.substr(eq + 1);
        has_value = true;
      } else if (i + 1 < args.size() && optional_value_word(args[i + 1])) {
        value = args[++i];
        has_value = true;
      }
    } else if (attached) {
      throw UsageError(fmt::format("{} ({}): takes no value", name, f->long_name));
    }
    const std::string shown = has_value ? fmt::format("{} {}", name, value) : name;
    ForeignDecision d{f->action, std::string(f->action == ForeignAction::Alias ? std::string_view(value) : f->text)};
    if (f->decide != nullptr) d = f->decide(value);
    switch (d.action) {
      case ForeignAction::Refuse:
        throw UsageError(fmt::format("{} ({}): {}", shown, f->long_name, d.text));
      case ForeignAction::Ignore:
        r.notes.push_back(fmt::format("{}: ignored: {}", shown, d.text));
        break;
      case ForeignAction::Alias: {
        const std::string target(f->text);
        if (!lookup.known(target)) {
          if (f->otherwise.empty())
            throw UsageError(fmt::format("{} ({}): not a flag of this subcommand", name, f->long_name));
          r.notes.push_back(fmt::format("{}: ignored: {}", shown, f->otherwise));
          break;
        }
        if (f->value == ForeignValue::None)
          r.args.push_back(target);
        else if (f->value == ForeignValue::Optional && !has_value)
          r.args.push_back(target);
        else
          r.args.push_back(target + "=" + d.text);
        break;
      }
    }
  }
  return r;
}

}  // namespace fdpp::cli
