// The help formatter (help_format.h).
#include "help_format.h"

namespace fdpp::cli {

std::vector<std::string> wrap_text(std::string_view text, size_t width) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view paragraph = text.substr(start, end - start);
    std::string line;
    size_t pos = 0;
    bool any = false;
    while (pos < paragraph.size()) {
      while (pos < paragraph.size() && paragraph[pos] == ' ') ++pos;
      if (pos >= paragraph.size()) break;
      size_t word_end = paragraph.find(' ', pos);
      if (word_end == std::string_view::npos) word_end = paragraph.size();
      std::string_view word = paragraph.substr(pos, word_end - pos);
      pos = word_end;
      while (word.size() > width) {  // a path or URL longer than a line
        if (!line.empty()) lines.push_back(std::move(line));
        line.clear();
        lines.emplace_back(word.substr(0, width));
        word.remove_prefix(width);
      }
      if (!line.empty() && line.size() + 1 + word.size() > width) {
        lines.push_back(std::move(line));
        line.clear();
      }
      if (!line.empty()) line += ' ';
      line += word;
      any = true;
    }
    if (!line.empty() || !any) lines.push_back(std::move(line));
    start = end + 1;
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

std::string HelpFormatter::two_columns(const std::string& left, const std::string& description) const {
  const size_t column = get_column_width();
  std::string out;
  std::vector<std::string> right = wrap_text(description, kHelpWidth - column);
  size_t first = 0;
  if (left.size() + 1 < column) {
    out = left + std::string(column - left.size(), ' ') + (right.empty() ? "" : right[0]);
    first = 1;
  } else {
    // The names alone on their line(s), indented as a short one would be.
    const size_t indent = left.find_first_not_of(' ') == std::string::npos ? 0 : left.find_first_not_of(' ');
    const std::vector<std::string> names = wrap_text(std::string_view(left).substr(indent), kHelpWidth - indent - 4);
    for (size_t i = 0; i < names.size(); ++i)
      out += (i == 0 ? std::string(indent, ' ') : "\n" + std::string(indent + 4, ' ')) + names[i];
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += '\n';
  for (size_t i = first; i < right.size(); ++i) out += std::string(column, ' ') + right[i] + '\n';
  return out;
}

std::string HelpFormatter::make_option(const CLI::Option* opt, bool is_positional) const {
  return two_columns("  " + make_option_name(opt, is_positional) + make_option_opts(opt), make_option_desc(opt));
}

std::string HelpFormatter::make_subcommand(const CLI::App* sub) const {
  return two_columns("  " + sub->get_display_name(), sub->get_description());
}

std::string HelpFormatter::make_description(const CLI::App* app) const {
  const std::string d = app->get_description();
  if (d.empty()) return "";
  std::string out;
  for (const std::string& line : wrap_text(d, kHelpWidth)) out += line + '\n';
  return out;
}

std::string HelpFormatter::make_footer(const CLI::App* app) const {
  const std::string f = app->get_footer();
  if (f.empty()) return "";
  std::string out;
  for (const std::string& line : wrap_text(f, kHelpWidth)) out += line + '\n';
  return out;
}

std::string HelpFormatter::make_usage(const CLI::App* app, std::string name) const {
  std::string usage = CLI::Formatter::make_usage(app, std::move(name));
  std::string out;
  for (const std::string& line : wrap_text(usage, kHelpWidth)) out += line + '\n';
  return out;
}

}  // namespace fdpp::cli
