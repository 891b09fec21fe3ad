// llama.cpp's multi-letter single-dash flags (-cnv, -ngl, -fa, -ctk, ...) and vLLM's -tp, as a table.
// CLI11 reads "-cnv" as the short-flag cluster "-c nv" ("--ctx-size: 'nv' is not an integer"), so
// main rewrites the command line before parsing: each spelling of the table either becomes fdpp's
// flag with the same meaning, or is dropped with a one-line note where it has no meaning here
// (-ngl 99: every layer is on the GPU anyway), or is refused by its name. A single-dash word of
// several letters that the table does not list is refused by its name too: never misparsed.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace fdpp::cli {

enum class ForeignAction {
  Alias,   // becomes fdpp's flag `text` (with the value, translated by `decide` where it has one)
  Ignore,  // dropped with its value; `text` says why it has no effect here
  Refuse,  // a usage error naming the flag; `text` says why
};

enum class ForeignValue {
  None,      // a switch
  Required,  // the next word is its value
  Optional,  // takes the next word only when it is on/off/auto/true/false/1/0 (llama.cpp's -fa, -co)
};

// What a value-dependent entry decides for one value (-ctk f16 is ignored, -ctk q8_0 refused).
struct ForeignDecision {
  ForeignAction action;
  std::string text;  // Alias: the value for fdpp's flag; Ignore: the note; Refuse: the reason
};

struct ForeignFlag {
  std::string_view spelling;   // "-cnv"
  std::string_view long_name;  // the origin's long name, for messages ("--conversation")
  ForeignValue value;
  ForeignAction action;
  std::string_view text;  // Alias: fdpp's flag; Ignore: the note; Refuse: the reason
  ForeignDecision (*decide)(std::string_view value) = nullptr;  // value-dependent entries only
  // Alias: the note when the subcommand lacks fdpp's flag ("" refuses it): llama-bench's -ngl 99
  // means nothing to fdpp bench, which runs every layer on the GPU.
  std::string_view otherwise = "";
};

// The table, in llama.cpp's --help order by topic.
const std::vector<ForeignFlag>& foreign_flags();
const ForeignFlag* find_foreign_flag(std::string_view spelling);

// What main knows of the subcommand being parsed (from its CLI11 app).
struct FlagLookup {
  std::function<bool(const std::string& flag)> known;        // "-p", "--conversation"
  std::function<bool(const std::string& flag)> takes_value;  // a known flag that needs a value
};

struct RewrittenArgs {
  std::vector<std::string> args;
  std::vector<std::string> notes;  // one line each, for stderr: "-fa on: ignored: ..."
};

// Rewrites the words after the subcommand. Throws UsageError naming the flag for a refused entry,
// an alias whose fdpp flag the subcommand lacks, a missing value, or an unknown multi-letter word.
// A word that is the value of the flag before it (-p -cnv) is left alone.
RewrittenArgs rewrite_foreign_flags(const std::vector<std::string>& args, const FlagLookup& lookup);

}  // namespace fdpp::cli
