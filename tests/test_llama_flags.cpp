// The CLI's table of llama.cpp's multi-letter flags (tools/fdpp/llama_flags.h), its escape
// processing of -p (chat.h) and the help formatter's wrapping (help_format.h). The binary's side
// (the notes on stderr, the refusals' exit status, --help's width) is tests/cli/test_cli_llama.py.
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "chat.h"
#include "cli_common.h"
#include "help_format.h"
#include "llama_flags.h"

namespace fdpp::cli {
namespace {

// A subcommand that has every fdpp flag the table's aliases name, plus -p and -n taking values.
FlagLookup lookup_with(std::set<std::string> known) {
  static const std::set<std::string> switches = {"--conversation", "--no-conversation", "--single-turn",
                                                 "--multiline-input"};
  return {[known](const std::string& f) { return known.count(f) > 0; },
          [known](const std::string& f) { return known.count(f) > 0 && switches.count(f) == 0; }};
}

FlagLookup generate_like() {
  std::set<std::string> known = {"-p", "--prompt", "-n", "-c", "-s"};
  for (const ForeignFlag& f : foreign_flags())
    if (f.action == ForeignAction::Alias) known.insert(std::string(f.text));
  return lookup_with(known);
}

std::string refusal(const std::vector<std::string>& args, const FlagLookup& lookup) {
  try {
    rewrite_foreign_flags(args, lookup);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(LlamaFlags, TableIsWellFormed) {
  std::set<std::string_view> seen;
  const std::regex multi_letter("-[A-Za-z][A-Za-z0-9-]+");
  for (const ForeignFlag& f : foreign_flags()) {
    SCOPED_TRACE(std::string(f.spelling));
    EXPECT_TRUE(std::regex_match(std::string(f.spelling), multi_letter));
    EXPECT_TRUE(seen.insert(f.spelling).second) << "listed twice";
    EXPECT_TRUE(f.long_name.starts_with("-"));
    if (f.action == ForeignAction::Alias)
      EXPECT_TRUE(f.text.starts_with("--"));
    else if (f.decide == nullptr)
      EXPECT_FALSE(f.text.empty());
  }
  // The flags issue 46 names must all be there.
  for (const char* s : {"-cnv", "-ngl", "-fa", "-sys", "-mli", "-co", "-ctk", "-ctv", "-nkvo", "-dev", "-sm", "-ts",
                        "-mg", "-tb", "-ub", "-np", "-cb"})
    EXPECT_NE(find_foreign_flag(s), nullptr) << s;
}

// Every entry does what its row says: an alias becomes fdpp's flag, an ignored one leaves a note and
// nothing else, a refused one is an error naming it.
TEST(LlamaFlags, EveryEntryActsAsItsRowSays) {
  const FlagLookup lookup = generate_like();
  for (const ForeignFlag& f : foreign_flags()) {
    SCOPED_TRACE(std::string(f.spelling));
    std::vector<std::string> args = {std::string(f.spelling)};
    if (f.value == ForeignValue::Required) args.push_back(f.decide != nullptr ? "0" : "1");
    args.insert(args.end(), {"-p", "hello"});
    ForeignAction action = f.action;
    if (f.decide != nullptr) action = f.decide(args[1]).action;
    if (action == ForeignAction::Refuse) {
      const std::string why = refusal(args, lookup);
      EXPECT_TRUE(why.starts_with(std::string(f.spelling) + " ")) << why;
      EXPECT_NE(why.find(std::string(f.long_name)), std::string::npos) << why;
      continue;
    }
    const RewrittenArgs r = rewrite_foreign_flags(args, lookup);
    if (action == ForeignAction::Ignore) {
      ASSERT_EQ(r.notes.size(), 1u);
      EXPECT_TRUE(r.notes[0].starts_with(std::string(f.spelling))) << r.notes[0];
      EXPECT_NE(r.notes[0].find("ignored"), std::string::npos);
      EXPECT_EQ(r.args, (std::vector<std::string>{"-p", "hello"}));
    } else {
      EXPECT_TRUE(r.notes.empty());
      ASSERT_EQ(r.args.size(), 3u);
      EXPECT_TRUE(r.args[0].starts_with(std::string(f.text))) << r.args[0];
      EXPECT_EQ(r.args[0].size() > f.text.size(), f.value == ForeignValue::Required) << r.args[0];
      EXPECT_EQ(r.args[1], "-p");
    }
  }
}

TEST(LlamaFlags, RewritesAsLlamaCppMeansThem) {
  const FlagLookup lookup = generate_like();
  using V = std::vector<std::string>;
  EXPECT_EQ(rewrite_foreign_flags({"-cnv", "-n", "5"}, lookup).args, (V{"--conversation", "-n", "5"}));
  EXPECT_EQ(rewrite_foreign_flags({"-ngl", "99"}, lookup).args, (V{"--n-gpu-layers=99"}));
  EXPECT_EQ(rewrite_foreign_flags({"-ngl=all"}, lookup).args, (V{"--n-gpu-layers=999"}));
  EXPECT_EQ(rewrite_foreign_flags({"-dev", "none"}, lookup).args, (V{"--device=cpu"}));
  EXPECT_EQ(rewrite_foreign_flags({"-dev", "CUDA0"}, lookup).args, (V{"--device=cuda"}));
  EXPECT_EQ(rewrite_foreign_flags({"-sys", "-be brief-"}, lookup).args, (V{"--system-prompt=-be brief-"}));
  // An optional value is taken only when it is one (llama.cpp's old -fa took none, its new one does).
  RewrittenArgs fa = rewrite_foreign_flags({"-fa", "-p", "x"}, lookup);
  EXPECT_EQ(fa.args, (V{"-p", "x"}));
  ASSERT_EQ(fa.notes.size(), 1u);
  EXPECT_TRUE(fa.notes[0].starts_with("-fa: ignored")) << fa.notes[0];
  fa = rewrite_foreign_flags({"-fa", "on", "-p", "x"}, lookup);
  EXPECT_EQ(fa.args, (V{"-p", "x"}));
  EXPECT_TRUE(fa.notes.at(0).starts_with("-fa on: ignored")) << fa.notes[0];
  EXPECT_EQ(rewrite_foreign_flags({"-co"}, lookup).args, (V{"--color"}));
  EXPECT_EQ(rewrite_foreign_flags({"-co", "off"}, lookup).args, (V{"--color=off"}));
  // Value-dependent rows.
  EXPECT_EQ(rewrite_foreign_flags({"-ctk", "f16"}, lookup).notes.size(), 1u);
  EXPECT_TRUE(refusal({"-ctk", "q8_0"}, lookup).starts_with("-ctk q8_0 (--cache-type-k): quantized"));
  EXPECT_TRUE(refusal({"-dev", "CUDA0,CUDA1"}, lookup).find("--tensor-parallel") != std::string::npos);
  EXPECT_TRUE(refusal({"-mg", "1"}, lookup).find("CUDA_VISIBLE_DEVICES") != std::string::npos);
  EXPECT_EQ(rewrite_foreign_flags({"-mg", "0"}, lookup).notes.size(), 1u);
}

TEST(LlamaFlags, NeverAShortFlagCluster) {
  const FlagLookup lookup = generate_like();
  using V = std::vector<std::string>;
  // Unknown multi-letter words are refused by their name, not read as "-c nv".
  EXPECT_TRUE(refusal({"-xyz"}, lookup).starts_with("-xyz: not a flag here")) << refusal({"-xyz"}, lookup);
  EXPECT_TRUE(refusal({"-cnvx"}, lookup).starts_with("-cnvx:"));
  // One-letter flags with the value attached still pass to CLI11 ("-n128", "-s-1").
  EXPECT_EQ(rewrite_foreign_flags({"-n128", "-c4096", "-s-1"}, lookup).args, (V{"-n128", "-c4096", "-s-1"}));
  // The value of a flag is left alone, whatever it looks like; so is everything after "--".
  EXPECT_EQ(rewrite_foreign_flags({"-p", "-cnv"}, lookup).args, (V{"-p", "-cnv"}));
  EXPECT_EQ(rewrite_foreign_flags({"--prompt", "-hf"}, lookup).args, (V{"--prompt", "-hf"}));
  EXPECT_EQ(rewrite_foreign_flags({"--", "-xyz"}, lookup).args, (V{"--", "-xyz"}));
  // A missing value, a value given to a switch, an alias the subcommand does not have.
  EXPECT_TRUE(refusal({"-ngl"}, lookup).starts_with("-ngl (--n-gpu-layers): needs a value"));
  EXPECT_TRUE(refusal({"-cnv=1"}, lookup).starts_with("-cnv (--conversation): takes no value"));
  EXPECT_TRUE(refusal({"-cnv"}, lookup_with({"-p"})).starts_with("-cnv (--conversation): not a flag of this"));
  // ... except where the row says what it means there instead (llama-bench's -ngl to fdpp bench).
  const RewrittenArgs bench = rewrite_foreign_flags({"-ngl", "99", "-p", "512"}, lookup_with({"-p"}));
  EXPECT_EQ(bench.args, (V{"-p", "512"}));
  EXPECT_EQ(bench.notes, (V{"-ngl 99: ignored: every layer runs on the device that runs the model"}));
}

TEST(Escapes, AsLlamaCppProcessesThem) {
  EXPECT_EQ(process_escapes(R"(a\nb\tc\rd)"), "a\nb\tc\rd");
  EXPECT_EQ(process_escapes(R"(\'\"\\)"), "'\"\\");
  EXPECT_EQ(process_escapes(R"(\x41\x4a\x4A!)"), "AJJ!");
  // Not an escape: kept as written (llama.cpp's default branch), a lone trailing backslash too.
  EXPECT_EQ(process_escapes(R"(\q\x4g\x4)"), R"(\q\x4g\x4)");
  EXPECT_EQ(process_escapes("end\\"), "end\\");
  EXPECT_EQ(process_escapes(R"(\\n)"), "\\n");  // an escaped backslash, then a plain n
}

TEST(HelpFormat, WrapsWithinTheWidth) {
  const std::string text =
      "a fairly long description of an option that goes on and on, past any sensible line width, with "
      "a_path_that_is_longer_than_the_line_itself_and_cannot_be_broken_at_a_space_anywhere_at_all_really_no "
      "and\nan explicit newline";
  for (size_t width : {20u, 40u, 70u}) {
    const std::vector<std::string> lines = wrap_text(text, width);
    std::string joined;
    for (const std::string& l : lines) {
      EXPECT_LE(l.size(), width) << l;
      joined += l;
    }
    std::string words;
    for (char c : text)
      if (c != ' ' && c != '\n') words += c;
    std::string got;
    for (char c : joined)
      if (c != ' ') got += c;
    EXPECT_EQ(got, words);  // nothing lost or added
  }
  EXPECT_EQ(wrap_text("x\ny", 10), (std::vector<std::string>{"x", "y"}));
}

}  // namespace
}  // namespace fdpp::cli
