#include "fdpp/model_config.h"

#include "fdpp/error.h"

namespace fdpp {

void validate(const ModelConfig& c, const std::string& origin) {
  // Upper bounds are far above any real model and keep size arithmetic far from overflow.
  auto in_range = [&](const char* field, int64_t v, int64_t lo, int64_t hi) {
    check(v >= lo && v <= hi, "{}: {} = {} is out of range [{}, {}]", origin, field, v, lo, hi);
  };
  in_range("n_layers", c.n_layers, 1, 1024);
  in_range("hidden_size", c.hidden, 1, 1 << 17);
  in_range("n_heads", c.n_heads, 1, 1024);
  in_range("n_kv_heads", c.n_kv_heads, 1, 1024);
  in_range("head_dim", c.head_dim, 2, 1024);
  in_range("ffn_hidden", c.ffn_hidden, 1, 1 << 20);
  in_range("vocab_size", c.vocab_size, 1, 1 << 24);
  in_range("max_context", c.max_context, 1, 1 << 24);
  check(c.n_heads % c.n_kv_heads == 0, "{}: n_heads = {} is not a multiple of n_kv_heads = {}", origin, c.n_heads,
        c.n_kv_heads);
  // Rotary settings matter only to models that rotate (OPT's learned positions leave them unset).
  if (c.position == PositionEncoding::Rope) {
    check(c.rope.rotary_dim > 0 && c.rope.rotary_dim <= c.head_dim && c.rope.rotary_dim % 2 == 0,
          "{}: rotary dim {} must be even and in [2, head_dim = {}]", origin, c.rope.rotary_dim, c.head_dim);
    check(c.rope.theta > 0, "{}: rope theta = {} must be positive", origin, c.rope.theta);
  } else {
    check(c.learned_position_offset >= 0 && c.learned_position_offset <= 1024,
          "{}: learned position offset = {} is out of range [0, 1024]", origin, c.learned_position_offset);
  }
  if (c.embed_dim != 0) in_range("embed_dim", c.embed_dim, 1, 1 << 17);
  check(c.norm_eps > 0 && c.norm_eps < 1, "{}: norm epsilon = {} must be in (0, 1)", origin, c.norm_eps);
  check(c.layer_windows.empty() || c.layer_windows.size() == static_cast<size_t>(c.n_layers),
        "{}: {} sliding-window entries for {} layers", origin, c.layer_windows.size(), c.n_layers);
  for (int w : c.layer_windows) check(w >= 0, "{}: sliding window = {} must be positive (or 0: none)", origin, w);
  if (c.n_experts != 0) {
    in_range("n_experts", c.n_experts, 1, 4096);
    in_range("n_experts_used", c.n_experts_used, 1, c.n_experts);
    in_range("expert_ffn_hidden", c.expert_ffn_hidden, 1, 1 << 20);
    check(c.expert_layers.empty() || c.expert_layers.size() == static_cast<size_t>(c.n_layers),
          "{}: {} expert-layer entries for {} layers", origin, c.expert_layers.size(), c.n_layers);
  } else {
    check(c.expert_layers.empty() && c.n_experts_used == 0, "{}: expert layers without experts", origin);
  }
  if (c.rope.scaling != RopeScaling::None && c.rope.scaling != RopeScaling::LongRope)
    check(c.rope.factor >= 1, "{}: rope scaling factor = {} must be >= 1", origin, c.rope.factor);
  if (c.rope.scaling == RopeScaling::LongRope) {
    const size_t half = static_cast<size_t>(c.rope.rotary_dim / 2);
    check(c.rope.short_factor.size() == half && c.rope.long_factor.size() == half,
          "{}: LongRope has {} short and {} long factors for rotary_dim / 2 = {} frequencies", origin,
          c.rope.short_factor.size(), c.rope.long_factor.size(), half);
    check(c.rope.attention_factor > 0, "{}: LongRope attention factor = {} must be positive", origin,
          c.rope.attention_factor);
  }
}

}  // namespace fdpp
