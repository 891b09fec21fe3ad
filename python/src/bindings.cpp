// fdpp._core: the engine as a Python extension (nanobind). The pure-Python layer in
// python/fdpp/__init__.py holds the user-facing API (LLM, SamplingParams, RequestOutput) and the
// argument checks; this file holds what must be C++: loading, the scheduler loop with the GIL
// released, logits handed over without a copy, and the translation of fdpp::Error into Python's
// exception hierarchy.
//
// Errors: fdpp has one error type, fdpp::Error, for every failure (a bad file, a bad request, a CUDA
// call that failed). Python wants ValueError for bad input and RuntimeError otherwise, so the
// binding decides by phase: whatever throws while the input is read and checked (resolving and
// loading the model, encoding text, Scheduler::submit, logits' id checks) is input
// (fdpp.InvalidInputError, a ValueError); whatever throws while the engine computes (make_engine,
// Scheduler::step, Runner::forward) is fdpp.EngineError (a RuntimeError). The message is the CLI's
// one line without its "fdpp: error: " prefix.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "grammar/grammar.h"
#include "engine/engine_runner.h"
#include "runtime/engine_args.h"
#include "runtime/open_engine.h"
#include "engine/prompt_file.h"
#include "engine/sampler.h"  // derived_seed
#include "engine/scheduler.h"
#include "fdpp/error.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tool_calls.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace fdpp::python {
namespace {

// Thrown by the binding for bad input; translated into fdpp.InvalidInputError.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A compiled structured-output grammar, handed from SamplingParams to each request that uses it.
struct CoreGrammar {
  std::shared_ptr<const grammar::Grammar> g;
};

PyObject* g_fdpp_error = nullptr;
PyObject* g_input_error = nullptr;
PyObject* g_engine_error = nullptr;

// Text the engine made as a Python str. A model may stop mid-character (at max_tokens or a stop
// token), which leaves bytes at the end that are not UTF-8: they become U+FFFD, as in HF's decode,
// instead of a UnicodeDecodeError.
nb::str text_str(std::string_view s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (o == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(o);
}

// Runs f, turning an fdpp::Error it throws into InputError (the input phase, see the top).
template <class F>
auto input_phase(F&& f, const std::string& prefix = {}) -> decltype(f()) {
  try {
    return f();
  } catch (const InputError&) {
    throw;
  } catch (const Error& e) {
    throw InputError(prefix + e.what());
  }
}

struct ModelState {
  std::string path;
  // The engine args as given (logits() on the CPU sizes a runner of its own from them).
  EngineArgs args;
  // The model, its engine and scheduler, opened as every front end opens them (runtime/open_engine.h):
  // on the GPU the weights stream from the files, with no host copy.
  std::unique_ptr<OpenedEngine> opened;
  Device device = Device::Cpu;

  const ModelConfig& config() const { return opened->model.config(); }
  Engine& engine() const { return *opened->engine; }
  Scheduler* scheduler() const { return opened->scheduler.get(); }
  // One caller drives the scheduler (step) at a time. Lock order: release the GIL first, then
  // take this mutex; code holding it takes the GIL only briefly (signal checks), never the
  // reverse, so two Python threads cannot deadlock.
  std::mutex mutex;

  const Tokenizer& tokenizer() const {
    if (!opened->model.tokenizer)
      throw InputError(path +
                       ": no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt); text needs one, "
                       "token ids do not");
    return *opened->model.tokenizer;
  }
};

// Checks for Ctrl-C (and other Python signal handlers) from a thread that released the GIL. Returns
// the pending exception, fetched so that it can be raised once the engine is left clean.
// Polls at most every 20 ms: taking the GIL costs microseconds when no other Python thread runs,
// but up to the interpreter's switch interval (5 ms) when one does, which per step would halve a
// fast GPU's throughput; 20 ms is far below what a person notices after Ctrl-C.
struct PendingSignal {
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  bool poll() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::milliseconds(20)) return false;
    last = now;
    nb::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    PyErr_Fetch(&type, &value, &trace);
    return true;
  }
  [[noreturn]] void raise() {  // with the GIL held
    PyErr_Restore(type, value, trace);
    throw nb::python_error();
  }
};

// Cancels the given requests and steps until they have all finished, so that their KV blocks are
// free and the scheduler is idle for the next call. Called with the mutex held and no GIL.
void cancel_and_drain(Scheduler& s, const std::vector<uint64_t>& ids, const std::function<bool()>& all_done) {
  for (uint64_t id : ids) s.cancel(id);
  while (!all_done()) {
    if (!s.step()) break;
  }
  s.settle();
}

// ---- generation ---------------------------------------------------------------------------------

struct Result {
  GenerationResult r;
};

// Calls `progress` (a Python callable, or None) with the number of finished requests, from the
// thread that released the GIL: throttled, because taking the GIL costs up to the interpreter's
// switch interval when another Python thread runs (see PendingSignal), and a bar needs no more.
struct ProgressReport {
  nb::handle callback;  // owned by the caller, which holds it for the whole call
  size_t reported = 0;
  std::chrono::steady_clock::time_point last{};
  // Returns true when the callback raised KeyboardInterrupt (Ctrl-C's handler runs inside it, as
  // the main thread's Python code): then `interrupt` holds it, to raise once the engine is clean.
  bool operator()(size_t finished, bool final, PendingSignal& interrupt) {
    if (!callback.is_valid() || callback.is_none() || finished == reported) return false;
    const auto now = std::chrono::steady_clock::now();
    if (!final && now - last < std::chrono::milliseconds(100)) return false;
    last = now;
    reported = finished;
    nb::gil_scoped_acquire gil;
    try {
      callback(finished);
    } catch (nb::python_error& e) {
      if (e.matches(PyExc_Exception)) {
        // A progress bar that fails must not fail the generation it reports on.
        e.discard_as_unraisable("fdpp: the progress callback");
        return false;
      }
      e.restore();
      PyErr_Fetch(&interrupt.type, &interrupt.value, &interrupt.trace);
      return true;
    }
    return false;
  }
};

std::vector<Result> generate(ModelState& st, std::vector<GenerationRequest> requests, nb::object progress) {
  const size_t n = requests.size();
  // Shared with the callbacks: should the engine fail and leave a request of ours behind, a later
  // step may still finish it after this function has returned.
  auto results = std::make_shared<std::vector<Result>>(n);
  std::optional<PendingSignal> signal;
  std::string input_error, engine_error;
  {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(st.mutex);
    Scheduler& s = *st.scheduler();
    std::vector<uint64_t> ids;
    ids.reserve(n);
    auto done = std::make_shared<std::vector<char>>(n, 0);
    auto finished = std::make_shared<size_t>(0);
    auto all_done = [&] { return *finished == ids.size(); };
    for (size_t i = 0; i < n; ++i) {
      GenerationCallbacks cb;
      // No deltas needed here: the text comes complete with the result.
      cb.on_delta = [](uint64_t, std::string_view, std::span<const int32_t>, std::span<const TokenLogprobs>) {};
      cb.on_finish = [results, done, finished, i](const GenerationResult& r) {
        (*results)[i].r = r;
        if (!(*done)[i]) {
          (*done)[i] = 1;
          ++*finished;
        }
      };
      try {
        ids.push_back(s.submit(std::move(requests[i]), std::move(cb)));
      } catch (const Error& e) {
        input_error = n > 1 ? "prompts[" + std::to_string(i) + "]: " + e.what() : std::string(e.what());
        break;
      }
    }
    try {
      if (!input_error.empty()) {
        cancel_and_drain(s, ids, all_done);
      } else {
        PendingSignal p;
        ProgressReport report{progress};
        while (!all_done()) {
          s.step();
          if (report(*finished, all_done(), p) || p.poll()) {
            signal = p;
            cancel_and_drain(s, ids, all_done);
            break;
          }
        }
        s.settle();  // the engine free for logits() between calls
      }
    } catch (const Error& e) {
      engine_error = e.what();
      try {
        cancel_and_drain(s, ids, all_done);
      } catch (const std::exception&) {
        // The engine failed twice; the first message is the one that explains it.
      }
    }
  }
  if (signal) signal->raise();
  if (!input_error.empty()) throw InputError(input_error);
  if (!engine_error.empty()) throw Error(engine_error);
  return std::move(*results);
}

// One request whose text is handed out as the scheduler produces it (LLM.stream). Other calls may
// step the scheduler meanwhile (a generate() in between): the pieces wait here until read.
class Stream {
 public:
  Stream(std::shared_ptr<ModelState> st, GenerationRequest request) : st_(std::move(st)), buf_(std::make_shared<Buf>()) {
    GenerationCallbacks cb;
    auto buf = buf_;
    cb.on_delta = [buf](uint64_t, std::string_view text, std::span<const int32_t>, std::span<const TokenLogprobs>) {
      std::lock_guard<std::mutex> lock(buf->mutex);
      if (!text.empty()) buf->pieces.emplace_back(text);
    };
    cb.on_finish = [buf](const GenerationResult& r) {
      std::lock_guard<std::mutex> lock(buf->mutex);
      buf->result = r;
      buf->done = true;
    };
    std::string error;
    {
      nb::gil_scoped_release release;
      try {
        id_ = st_->scheduler()->submit(std::move(request), std::move(cb));
      } catch (const Error& e) {
        error = e.what();
      }
    }
    if (!error.empty()) throw InputError(error);
  }

  // A stream dropped before it finished (never iterated, or its generator collected) cancels its
  // request; the next step of any call frees the blocks. cancel() only takes the scheduler's own
  // lock, so this is safe with the GIL held.
  ~Stream() {
    if (id_ != 0 && !finished()) st_->scheduler()->cancel(id_);
  }

  // The next piece of text, or None when the request has finished.
  std::optional<std::string> next() {
    std::optional<PendingSignal> signal;
    std::optional<std::string> piece;
    std::string engine_error;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(st_->mutex);
      try {
        while (true) {
          if (auto p = pop()) {
            piece = std::move(p);
            break;
          }
          if (finished()) break;
          st_->scheduler()->step();
          if (poller_.poll()) {
            signal = poller_;
            poller_ = PendingSignal{};
            cancel_and_drain(*st_->scheduler(), {id_}, [this] { return finished(); });
            break;
          }
        }
      } catch (const Error& e) {
        engine_error = e.what();
      }
    }
    if (signal) signal->raise();
    if (!engine_error.empty()) throw Error(engine_error);
    return piece;
  }

  // Stops the request (the generator was closed or dropped) and waits until its blocks are free.
  void cancel() {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(st_->mutex);
    if (finished()) return;
    try {
      cancel_and_drain(*st_->scheduler(), {id_}, [this] { return finished(); });
    } catch (const std::exception&) {
      // Called from a generator's close(): an engine failure surfaces at the next call instead.
    }
  }

  std::optional<Result> result() {
    std::lock_guard<std::mutex> lock(buf_->mutex);
    if (!buf_->done) return std::nullopt;
    return Result{buf_->result};
  }

 private:
  struct Buf {
    std::mutex mutex;
    std::deque<std::string> pieces;
    bool done = false;
    GenerationResult result;
  };
  std::optional<std::string> pop() {
    std::lock_guard<std::mutex> lock(buf_->mutex);
    if (buf_->pieces.empty()) return std::nullopt;
    std::string p = std::move(buf_->pieces.front());
    buf_->pieces.pop_front();
    return p;
  }
  bool finished() {
    std::lock_guard<std::mutex> lock(buf_->mutex);
    return buf_->done;
  }

  std::shared_ptr<ModelState> st_;
  std::shared_ptr<Buf> buf_;
  uint64_t id_ = 0;
  PendingSignal poller_;  // kept across next() calls: one piece per step would otherwise never poll
};

// ---- the model ----------------------------------------------------------------------------------

// fdpp.LLM's keywords: each is an option of the engine table (runtime/engine_args.h), checked there
// with the CLI's ranges and messages. Python values become the table's text: ints (not bools) for
// integers, bools for switches, strings for the rest; None keeps the default.
std::string option_text(const EngineOption& o, const std::string& key, nb::handle value) {
  const bool is_bool = PyBool_Check(value.ptr());
  switch (o.kind) {
    case OptionKind::Integer:
      if (is_bool || !PyLong_Check(value.ptr())) throw InputError(key + ": expected an integer");
      return nb::cast<std::string>(nb::str(value));
    case OptionKind::Switch:
      if (!is_bool) throw InputError(key + ": expected True or False");
      return value.ptr() == Py_True ? "true" : "false";
    case OptionKind::Real:
      if (is_bool || !(PyLong_Check(value.ptr()) || PyFloat_Check(value.ptr())))
        throw InputError(key + ": expected a number");
      // repr round-trips a float exactly, so the table checks the value the caller gave.
      return nb::cast<std::string>(nb::repr(value));
    default:
      if (!nb::isinstance<nb::str>(value)) throw InputError(key + ": expected a string");
      return nb::cast<std::string>(value);
  }
}

std::shared_ptr<ModelState> load(nb::dict options) {
  auto st = std::make_shared<ModelState>();
  for (auto [k, v] : options) {
    const std::string key = nb::cast<std::string>(nb::str(k));
    if (v.is_none()) continue;
    const EngineOption* o = find_engine_option(key);
    if (o == nullptr || (o->front_ends & kPython) == 0) throw InputError(key + ": not an option of fdpp.LLM");
    const std::string text = option_text(*o, key, v);
    input_phase([&] { set_engine_option(st->args, *o, text, key); });
  }
  std::string input_error, engine_error;
  {
    nb::gil_scoped_release release;
    try {
      input_phase([&] {
        st->args.check(/*python=*/true);
        st->device = st->args.load_format == "dummy" ? Device::Cuda : resolve_device(st->args.requested_device());
      });
      st->opened = std::make_unique<OpenedEngine>();
      input_phase([&] { st->opened->model = open_model(st->args); });
      st->path = st->opened->model.path;
      // generate() submits all its prompts at once; the queue is bounded by memory, not a count.
      start_engine(*st->opened, st->args, INT_MAX);
    } catch (const InputError& e) {
      input_error = e.what();
    } catch (const Error& e) {
      engine_error = e.what();
    }
  }
  if (!input_error.empty()) throw InputError(input_error);
  if (!engine_error.empty()) throw Error(engine_error);
  return st;
}

Scheduler& scheduler_of(ModelState& st) {
  st.tokenizer();  // generation needs text: the same message as the CLI's when there is none
  return *st.scheduler();
}

using LogitsArray = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

nb::object logits(ModelState& st, std::vector<int32_t> ids, bool as_torch) {
  const ModelConfig& c = st.config();
  input_phase([&] {
    check(!ids.empty(), "token_ids is empty");
    for (int32_t id : ids) check(id >= 0 && id < c.vocab_size, "token id {} is out of range [0, {})", id, c.vocab_size);
    check(static_cast<int64_t>(ids.size()) <= st.engine().max_context(), "{} tokens exceed the context length {}",
          ids.size(), st.engine().max_context());
  });
  auto* out = new std::vector<float>(ids.size() * static_cast<size_t>(c.vocab_size));
  nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  std::string engine_error;
  {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(st.mutex);
    try {
      if (st.device == Device::Cpu) {
        // As `fdpp logits`: a runner sized to the ids over the same host weights, so the numbers
        // match bit for bit.
        st.opened->model.make_runner(st.args, static_cast<int>(ids.size()))->forward(ids, 0, true, *out);
      } else {
        // A sequence of the engine itself, between the scheduler's steps (the mutex is held): the
        // weights are on the GPU once. It needs free KV blocks like any request.
        EngineRunner(st.engine(), static_cast<int>(ids.size())).forward(ids, 0, /*all_positions=*/true, *out);
      }
    } catch (const Error& e) {
      engine_error = e.what();
    }
  }
  if (!engine_error.empty()) throw Error(engine_error);
  const size_t shape[2] = {ids.size(), static_cast<size_t>(c.vocab_size)};
  // Both views share `out` through the capsule: numpy's array and torch's tensor (via DLPack)
  // are made without copying the [T, vocab] floats.
  if (as_torch) return nb::cast(nb::ndarray<nb::pytorch, float, nb::ndim<2>>(out->data(), 2, shape, owner));
  return nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<2>>(out->data(), 2, shape, owner));
}

// A message as the package hands it over: (role, content, tool_call_id, [(id, name, arguments)]).
using PyToolCall = std::tuple<std::string, std::string, std::string>;
using PyMessage = std::tuple<std::string, std::string, std::string, std::vector<PyToolCall>>;

std::vector<ChatMessage> to_messages(const std::vector<PyMessage>& m) {
  std::vector<ChatMessage> out;
  out.reserve(m.size());
  for (const auto& [role, content, tool_call_id, calls] : m) {
    ChatMessage msg{role, content};
    msg.tool_call_id = tool_call_id;
    for (const auto& [id, name, arguments] : calls) msg.tool_calls.push_back({id, name, arguments});
    out.push_back(std::move(msg));
  }
  return out;
}

// tools: each tool's JSON text (json.dumps of the dict, which keeps its key order).
ChatOptions chat_options(std::optional<bool> enable_thinking, std::vector<std::string> tools) {
  ChatOptions o;
  o.enable_thinking = enable_thinking;
  o.tools = std::move(tools);
  return o;
}

// A conversation to prompt ids with the CLI's rules (encode_prompt, as `fdpp generate --chat`):
// the template with the generation prompt, no second BOS when the template writes one, special
// tokens parsed. Returns the rendered text too (RequestOutput.prompt).
std::pair<std::string, std::vector<int32_t>> encode_chat(ModelState& st, const std::vector<PyMessage>& m,
                                                         std::optional<bool> enable_thinking,
                                                         std::vector<std::string> tools) {
  const Tokenizer& t = st.tokenizer();
  return input_phase([&] {
    const std::vector<ChatMessage> messages = to_messages(m);
    const ChatOptions options = chat_options(enable_thinking, std::move(tools));
    std::string text = t.apply_chat_template(messages, /*add_generation_prompt=*/true, options);
    std::vector<int32_t> ids = encode_prompt(t, "", messages, /*chat=*/true, /*system=*/"", options);
    check(!ids.empty(), "the conversation encodes to no tokens");
    return std::make_pair(std::move(text), std::move(ids));
  });
}

// Log probabilities for Python: (logprob, rank, [(id, logprob), ...]) per token.
std::vector<std::tuple<float, int32_t, std::vector<std::pair<int32_t, float>>>> logprob_tuples(
    const std::vector<TokenLogprobs>& lps) {
  std::vector<std::tuple<float, int32_t, std::vector<std::pair<int32_t, float>>>> out;
  for (const TokenLogprobs& t : lps) {
    std::vector<std::pair<int32_t, float>> top;
    for (const TokenLogprob& e : t.top) top.emplace_back(e.id, e.logprob);
    out.emplace_back(t.logprob, t.rank, std::move(top));
  }
  return out;
}

// llm.tokenizer: shares the model's state so that it stays valid after the LLM is dropped.
struct TokenizerRef {
  std::shared_ptr<ModelState> st;
};

}  // namespace
}  // namespace fdpp::python

using namespace fdpp;
using namespace fdpp::python;

NB_MODULE(_core, m) {
  m.doc() = "fdpp's engine (C++). Use the API of the fdpp package, not this module.";

  // The exception hierarchy (fdpp.FdppError and its two kinds), made here so that the C++
  // translator can raise them; python/fdpp/__init__.py re-exports them.
  g_fdpp_error = PyErr_NewExceptionWithDoc("fdpp.FdppError", "Base class of every error fdpp raises.",
                                           PyExc_Exception, nullptr);
  nb::object input_bases = nb::make_tuple(nb::handle(g_fdpp_error), nb::handle(PyExc_ValueError));
  g_input_error = PyErr_NewExceptionWithDoc(
      "fdpp.InvalidInputError",
      "Bad input: a missing or corrupt model file, an argument out of range, a prompt that does not fit.",
      input_bases.ptr(), nullptr);
  nb::object engine_bases = nb::make_tuple(nb::handle(g_fdpp_error), nb::handle(PyExc_RuntimeError));
  g_engine_error = PyErr_NewExceptionWithDoc("fdpp.EngineError",
                                             "The engine failed while computing (a CUDA error, out of device memory).",
                                             engine_bases.ptr(), nullptr);
  m.attr("max_stop_token_ids") = kMaxStopTokenIds;  // SamplingParams checks it when made
  m.def("derived_seed", &derived_seed, "seed"_a, "choice"_a,
        "The seed of choice `choice` > 0 of a request seeded `seed` (n > 1), as fdpp serve derives it.");
  m.attr("FdppError") = nb::handle(g_fdpp_error);
  m.attr("InvalidInputError") = nb::handle(g_input_error);
  m.attr("EngineError") = nb::handle(g_engine_error);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(g_input_error, e.what());
    } catch (const Error& e) {
      PyErr_SetString(g_engine_error, e.what());
    }
    // Anything else is rethrown by rethrow_exception above into nanobind's own translators
    // (python_error, bad_alloc -> MemoryError, other std::exception -> RuntimeError).
  });

#ifdef FDPP_HAVE_CUDA
  m.attr("cuda_built") = true;
#else
  m.attr("cuda_built") = false;
#endif
  m.def("default_model_path", [] { return default_model_path(); },
        "The default model's path: $FDPP_MODEL, else SmolLM2-135M-Instruct.Q4_1.gguf in fdpp's cache.");

  nb::class_<SamplingParams>(m, "CoreSampling")
      .def(nb::init<>())
      .def_rw("temperature", &SamplingParams::temperature)
      .def_rw("top_k", &SamplingParams::top_k)
      .def_rw("top_p", &SamplingParams::top_p)
      .def_rw("min_p", &SamplingParams::min_p)
      .def_rw("repeat_penalty", &SamplingParams::repeat_penalty)
      .def_rw("repeat_last_n", &SamplingParams::repeat_last_n)
      .def_rw("seed", &SamplingParams::seed)
      .def_rw("presence_penalty", &SamplingParams::presence_penalty)
      .def_rw("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_rw("min_tokens", &SamplingParams::min_tokens)
      .def_rw("logprobs", &SamplingParams::logprobs)
      .def_prop_rw(
          "logit_bias",
          [](const SamplingParams& s) {
            std::vector<std::pair<int32_t, float>> out;
            for (const LogitBias& b : s.logit_bias) out.emplace_back(b.id, b.bias);
            return out;
          },
          [](SamplingParams& s, const std::vector<std::pair<int32_t, float>>& v) {
            s.logit_bias.clear();
            for (const auto& [id, bias] : v) s.logit_bias.push_back({id, bias});
          });

  nb::class_<GenerationRequest>(m, "CoreRequest")
      .def(nb::init<>())
      .def_rw("prompt", &GenerationRequest::prompt)
      .def_rw("sampling", &GenerationRequest::sampling)
      .def_rw("max_tokens", &GenerationRequest::max_tokens)
      .def_rw("ignore_eos", &GenerationRequest::ignore_eos)
      .def_rw("stop", &GenerationRequest::stop)
      .def_rw("stop_token_ids", &GenerationRequest::stop_token_ids)
      .def_rw("prompt_logprobs", &GenerationRequest::prompt_logprobs)
      .def("set_grammar", [](GenerationRequest& r, const CoreGrammar& g) { r.grammar = g.g; }, "grammar"_a);

  nb::class_<CoreGrammar>(m, "CoreGrammar");
  // kind: "json" (spec: a JSON schema as text), "json_object", "regex" (spec: the pattern) or
  // "choice" (choices). What the engine cannot compile is InvalidInputError naming it.
  m.def(
      "compile_grammar",
      [](const std::string& kind, const std::string& spec, const std::vector<std::string>& choices) {
        try {
          if (kind == "json") return CoreGrammar{grammar::compile_json_schema(spec)};
          if (kind == "json_object") return CoreGrammar{grammar::compile_json_object()};
          if (kind == "regex") return CoreGrammar{grammar::compile_regex(spec)};
          if (kind == "choice") return CoreGrammar{grammar::compile_choice(choices)};
        } catch (const Error& e) {
          throw InputError(e.what());
        }
        throw InputError("unknown structured output kind '" + kind + "'");
      },
      "kind"_a, "spec"_a = "", "choices"_a = std::vector<std::string>{});

  nb::class_<Result>(m, "CoreResult")
      .def_prop_ro("id", [](const Result& r) { return r.r.id; })
      .def_prop_ro("prompt", [](const Result& r) { return r.r.prompt; })
      .def_prop_ro("token_ids", [](const Result& r) { return r.r.token_ids; })
      .def_prop_ro("text", [](const Result& r) { return text_str(r.r.text); })
      .def_prop_ro("finish_reason", [](const Result& r) { return r.r.finish_reason; })
      .def_prop_ro("error", [](const Result& r) { return r.r.error; })
      .def_prop_ro("stop_reason",
                   [](const Result& r) -> nb::object {
                     if (r.r.stop_token_id) return nb::int_(*r.r.stop_token_id);
                     if (r.r.stop_string) return text_str(*r.r.stop_string);
                     return nb::none();
                   })
      // Per generated token (when the request asked): (logprob, rank, [(id, logprob), ...]).
      .def_prop_ro("logprobs",
                   [](const Result& r) { return logprob_tuples(r.r.logprobs); })
      // Per prompt token from the second on (prompt_logprobs), as logprobs.
      .def_prop_ro("prompt_logprobs",
                   [](const Result& r) { return logprob_tuples(r.r.prompt_logprobs); })
      .def_prop_ro("cumulative_logprob", [](const Result& r) { return r.r.cumulative_logprob; })
      .def_prop_ro("preemptions", [](const Result& r) { return r.r.preemptions; })
      .def_prop_ro("cached_tokens", [](const Result& r) { return r.r.cached_tokens; })
      .def_prop_ro("time_to_first_token", [](const Result& r) { return r.r.time_to_first_token; })
      .def_prop_ro("total_time", [](const Result& r) { return r.r.total_time; })
      .def_prop_ro("time_per_output_token", [](const Result& r) { return r.r.time_per_output_token(); });

  nb::class_<Stream>(m, "CoreStream")
      .def(
          "next",
          [](Stream& s) -> nb::object {
            std::optional<std::string> piece = s.next();
            if (!piece) return nb::none();
            return text_str(*piece);
          },
          "The next piece of text; None once the request has finished.")
      .def("cancel", &Stream::cancel, "Cancels the request and waits until its KV blocks are free.")
      .def("result", &Stream::result, "The finished request's result; None before it has finished.");

  m.def(
      "engine_option_names",
      [] {
        std::vector<std::string> names;
        for (const EngineOption& o : engine_options())
          if (o.front_ends & kPython) {
            names.push_back(o.name);
            names.insert(names.end(), o.python_aliases.begin(), o.python_aliases.end());
          }
        return names;
      },
      "The keywords fdpp.LLM passes to the engine option table.");

  nb::class_<ModelState>(m, "CoreModel")
      .def_static("load", &load, "options"_a)
      .def_prop_ro("path", [](const ModelState& s) { return s.path; })
      .def_prop_ro("device", [](const ModelState& s) { return std::string(device_name(s.device)); })
      .def_prop_ro("architecture", [](const ModelState& s) { return s.config().architecture; })
      .def_prop_ro("vocab_size", [](const ModelState& s) { return s.config().vocab_size; })
      .def_prop_ro("max_model_len", [](const ModelState& s) { return s.engine().max_context(); })
      .def_prop_ro("has_tokenizer", [](const ModelState& s) { return s.opened->model.tokenizer != nullptr; })
      .def(
          "generate",
          [](ModelState& s, std::vector<GenerationRequest> requests, nb::object progress) {
            scheduler_of(s);
            return generate(s, std::move(requests), std::move(progress));
          },
          "requests"_a, "progress"_a = nb::none())
      .def(
          "stream",
          [](const std::shared_ptr<ModelState>& s, GenerationRequest request) {
            scheduler_of(*s);
            return std::make_unique<Stream>(s, std::move(request));
          },
          "request"_a)
      .def("logits", &logits, "token_ids"_a, "as_torch"_a = false)
      .def("encode_chat", &encode_chat, "messages"_a, "enable_thinking"_a = nb::none(),
           "tools"_a = std::vector<std::string>{})
      .def("tokenizer",
           [](const std::shared_ptr<ModelState>& s) {
             s->tokenizer();  // a bare checkpoint: the CLI's "no tokenizer" message
             return TokenizerRef{s};
           })
      .def("stats", [](ModelState& s) {
        nb::dict d;
        if (!s.scheduler()) return d;
        const SchedulerStats st = s.scheduler()->stats();
        d["running"] = st.running;
        d["waiting"] = st.waiting;
        d["kv_blocks_used"] = st.kv_blocks_used;
        d["kv_blocks_free"] = st.kv_blocks_free;
        d["prompt_tokens"] = st.prompt_tokens;
        d["generated_tokens"] = st.generated_tokens;
        d["preemptions"] = st.preemptions;
        d["requests_finished"] = st.requests_finished;
        d["steps"] = st.steps;
        d["prefix_cache_queries"] = st.prefix_cache_queries;
        d["prefix_cache_hits"] = st.prefix_cache_hits;
        d["prefix_cache_evictions"] = st.prefix_cache_evictions;
        d["kv_blocks_cached"] = st.kv_blocks_cached;
        return d;
      });

  nb::class_<TokenizerRef>(m, "CoreTokenizer")
      .def(
          "encode",
          [](const TokenizerRef& t, const std::string& text, std::optional<bool> add_bos, bool parse_special) {
            const Tokenizer& tok = t.st->tokenizer();
            return input_phase([&] { return tok.encode(text, add_bos.value_or(tok.add_bos_by_default()), parse_special); });
          },
          "text"_a, "add_bos"_a = nb::none(), "parse_special"_a = true)
      .def(
          "decode",
          [](const TokenizerRef& t, const std::vector<int32_t>& ids, bool skip_special) {
            const Tokenizer& tok = t.st->tokenizer();
            const std::string s = input_phase([&] { return tok.decode(ids, skip_special); });
            return text_str(s);
          },
          "ids"_a, "skip_special"_a = true)
      .def(
          "apply_chat_template",
          [](const TokenizerRef& t, const std::vector<PyMessage>& m, bool gen, std::optional<bool> enable_thinking,
             std::vector<std::string> tools) {
            const Tokenizer& tok = t.st->tokenizer();
            return input_phase(
                [&] { return tok.apply_chat_template(to_messages(m), gen, chat_options(enable_thinking, std::move(tools))); });
          },
          "messages"_a, "add_generation_prompt"_a = true, "enable_thinking"_a = nb::none(),
          "tools"_a = std::vector<std::string>{})
      .def_prop_ro("tool_call_format",
                   [](const TokenizerRef& t) { return std::string(tool_call_format_name(t.st->tokenizer().tool_call_format())); })
      .def(
          "parse_tool_calls",
          [](const TokenizerRef& t, const std::string& text) {
            // (content, [(name, arguments)]): the calls the model wrote in its template's syntax.
            const ParsedToolCalls p = parse_tool_calls(t.st->tokenizer().tool_call_format(), text);
            std::vector<std::pair<std::string, std::string>> calls;
            for (const ToolCall& c : p.calls) calls.emplace_back(c.name, c.arguments);
            return std::make_pair(text_str(p.content), calls);
          },
          "text"_a)
      .def("token_to_id",
           [](const TokenizerRef& t, const std::string& s) -> std::optional<int32_t> {
             const int32_t id = t.st->tokenizer().token_id(s);
             if (id < 0) return std::nullopt;
             return id;
           })
      .def("id_to_token",
           [](const TokenizerRef& t, int32_t id) {
             const Tokenizer& tok = t.st->tokenizer();
             if (id < 0 || id >= tok.vocab_size())
               throw InputError(fmt::format("token id {} is out of range [0, {})", id, tok.vocab_size()));
             return text_str(tok.token_text(id));
           })
      .def("is_special", [](const TokenizerRef& t, int32_t id) { return t.st->tokenizer().is_special(id); })
      .def_prop_ro("vocab_size", [](const TokenizerRef& t) { return t.st->tokenizer().vocab_size(); })
      .def_prop_ro("bos_token_id",
                   [](const TokenizerRef& t) -> std::optional<int32_t> {
                     const int32_t id = t.st->tokenizer().bos_id();
                     if (id < 0) return std::nullopt;
                     return id;
                   })
      .def_prop_ro("eos_token_id",
                   [](const TokenizerRef& t) -> std::optional<int32_t> {
                     const int32_t id = t.st->tokenizer().eos_id();
                     if (id < 0) return std::nullopt;
                     return id;
                   })
      .def_prop_ro("add_bos_by_default", [](const TokenizerRef& t) { return t.st->tokenizer().add_bos_by_default(); });

  // The table of request limits (src/engine/request_limits.h): SamplingParams checks its values here,
  // so that a value out of range gets the range and the message that a prompts file's line, the
  // server and the sampler give. Each returns "" when the value is allowed, else the message.
  // request_param_problem takes the value as Python holds it: an int (beyond int64 too) or a float;
  // a bool or anything else is a type problem, shown as its repr.
  m.def(
      "request_param_problem",
      [](const std::string& name, nb::handle value) -> std::string {
        const RequestParam& p = request_param(name);
        if (nb::isinstance<nb::int_>(value) && !nb::isinstance<nb::bool_>(value)) {
          int64_t v = 0;
          if (!nb::try_cast(value, v)) return param_message(name, nb::str(value).c_str(), out_of_range_problem(p));
          return p.type == ParamType::Real ? check_request_param(name, static_cast<double>(v))
                                           : check_request_param(name, v);
        }
        if (nb::isinstance<nb::float_>(value) && p.type == ParamType::Real)
          return check_request_param(name, nb::cast<double>(value));
        std::string shown = nb::repr(value).c_str();
        if (shown.size() > 60) shown = shown.substr(0, 57) + "...";  // as json_show bounds the server's
        return type_message(p, name, shown);
      },
      "name"_a, "value"_a);
  m.def("request_list_problem", [](const std::string& name, size_t count) { return list_count_message(name, count); },
        "name"_a, "count"_a);
  m.def(
      "stop_string_problem",
      [](const std::string& s) -> std::string {
        const std::string p = stop_string_problem(s);
        return p.empty() ? "" : "\"stop\" " + p;
      },
      "text"_a);
}
