// --help as fdpp prints it: options grouped by topic (each subcommand names its groups), every line
// within kHelpWidth columns. CLI11 2.1 does not wrap descriptions, so this formatter does.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace fdpp::cli {

inline constexpr size_t kHelpWidth = 100;

// Greedy word wrap of text (its own newlines kept) into lines of at most width columns; a word
// longer than width is cut.
std::vector<std::string> wrap_text(std::string_view text, size_t width);

class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(30); }
  std::string make_option(const CLI::Option* opt, bool is_positional) const override;
  std::string make_subcommand(const CLI::App* sub) const override;
  std::string make_description(const CLI::App* app) const override;
  std::string make_footer(const CLI::App* app) const override;
  std::string make_usage(const CLI::App* app, std::string name) const override;

 private:
  // "  left   description" with both sides wrapped; left on a line of its own when it is too wide.
  std::string two_columns(const std::string& left, const std::string& description) const;
};

}  // namespace fdpp::cli
