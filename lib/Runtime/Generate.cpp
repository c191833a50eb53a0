//===- Generate.cpp - a model binary serving generation requests ---------===//
//
// `--generate`: a program made by tdx.trace_generate (entries prefill, the
// main one, and decode) served from a request loop, no Python at run time.
// Rank 0 reads one JSON request a line from stdin and every rank gets it;
// each step's logits come back to rank 0, which picks the tokens, hands
// them to every rank and writes them out as they are made, one JSON line a
// step. A malformed request is answered with its error and the loop goes
// on. With --refresh-from store:KEY the newest version of KEY replaces the
// weights between requests (each rank its boxes; the program stays).
//
// The tokens are picked as python/tdx/decoding.py picks them (greedy, or
// temperature, top-k, top-p and a draw from a counter-based uniform of the
// seed, step and row), so the binary and the runner agree.
//
//===----------------------------------------------------------------------===//

#include "tdx/StateFormat/Checkpoint.h"
#include "tdx/StateFormat/Json.h"
#include "tdx/Runtime/Serve.h"
#include "tdx/Store/Volumes.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>

using namespace tdx::rt;

namespace {

struct BadRequest : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What the program was traced for, read from its entries' shapes.
struct Spec {
  int64_t batch = 0, prompt = 0, length = 0, vocab = 0;
};

Spec specOf(const std::vector<EntryShapes> &shapes) {
  auto fail = [] {
    throw std::runtime_error(
        "--generate serves a program made by tdx.trace_generate (a prefill taking ids "
        "(B, P), attention_mask (B, L), positions (B, P), and a decode entry); this program "
        "is not one");
  };
  if (shapes.size() != 2 || shapes[0].inputs.size() != 3 || shapes[1].inputs.size() != 3 ||
      shapes[0].outputs.size() != 1 || shapes[0].inputs[0].size() != 2 ||
      shapes[0].inputs[1].size() != 2 || shapes[0].outputs[0].size() != 2)
    fail();
  Spec s;
  s.batch = shapes[0].inputs[0][0];
  s.prompt = shapes[0].inputs[0][1];
  s.length = shapes[0].inputs[1][1];
  s.vocab = shapes[0].outputs[0][1];
  if (shapes[1].inputs[0] != std::vector<int64_t>{s.batch, 1})
    fail();
  return s;
}

/// The uniform in [0, 1) that sequence `row` draws at step `step` of a
/// request with `seed` (splitmix64; decoding.py's _uniform).
double uniform(uint64_t seed, uint64_t step, uint64_t row) {
  uint64_t z = (seed * 1000003ull + step) * 1000003ull + row;
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

struct Sampling {
  bool sample = false;
  double temperature = 1.0;
  int64_t topK = 0;   // 0: none
  double topP = 1.0;
  uint64_t seed = 0;
};

/// The token row `logits` (`vocab` floats) picks: argmax (the first of
/// equal ones), or a draw after temperature, top-k and top-p, as
/// Hugging Face orders them.
int64_t pick(const float *logits, int64_t vocab, const Sampling &s, uint64_t step,
             uint64_t row) {
  if (!s.sample)
    return std::max_element(logits, logits + vocab) - logits;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> scores(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    scores[i] = static_cast<double>(logits[i]) / s.temperature;
  if (s.topK > 0 && s.topK < vocab) {
    std::vector<double> sorted = scores;
    std::nth_element(sorted.begin(), sorted.begin() + (s.topK - 1), sorted.end(),
                     std::greater<double>());
    double kth = sorted[s.topK - 1];
    for (double &x : scores)
      if (x < kth)
        x = -inf;
  }
  if (s.topP < 1.0) {
    std::vector<int64_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return scores[a] < scores[b]; });
    double top = scores[order.back()], total = 0;
    for (int64_t i : order)
      total += std::exp(scores[i] - top);
    double cum = 0;
    for (size_t j = 0; j + 1 < order.size(); ++j) {
      cum += std::exp(scores[order[j]] - top) / total;
      if (cum <= 1 - s.topP)
        scores[order[j]] = -inf;
    }
  }
  double top = *std::max_element(scores.begin(), scores.end()), total = 0;
  std::vector<double> p(scores.size());
  for (size_t i = 0; i < scores.size(); ++i)
    total += p[i] = std::exp(scores[i] - top);
  double target = uniform(s.seed, step, row) * total, cum = 0;
  int64_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0)
      continue;
    last = static_cast<int64_t>(i);
    cum += p[i];
    if (cum > target)
      return last;
  }
  return last;
}

std::vector<int64_t> integers(const json::Value *v, const char *what) {
  std::vector<int64_t> out;
  if (!v)
    return out;
  if (std::optional<int64_t> one = v->getAsInteger())
    return {*one};
  const json::Array *a = v->getAsArray();
  if (!a)
    throw BadRequest(std::string(what) + " must be an integer or a list of integers");
  for (const json::Value &x : *a) {
    std::optional<int64_t> i = x.getAsInteger();
    if (!i)
      throw BadRequest(std::string(what) + " must hold integers");
    out.push_back(*i);
  }
  return out;
}

struct GenerationRequest {
  json::Value id;
  std::vector<std::vector<int64_t>> prompts;
  int64_t newTokens = 20;
  Sampling sampling;
  std::vector<int64_t> eos;
  int64_t pad = 0;
};

GenerationRequest parseRequest(const std::string &line, const Spec &spec, const Options &o) {
  std::optional<json::Value> parsed = json::parse(line);
  const json::Object *q = parsed ? parsed->getAsObject() : nullptr;
  if (!q)
    throw BadRequest("a request is one JSON object a line, like {\"input_ids\": [[1, 2, 3]], "
                     "\"max_new_tokens\": 16}");
  GenerationRequest r;
  if (const json::Value *id = q->get("id"))
    r.id = *id;
  const json::Array *ids = q->getArray("input_ids");
  if (!ids || ids->empty())
    throw BadRequest("the request has no \"input_ids\" (a list of prompts, each a list of "
                     "token ids)");
  bool one = (*ids)[0].getAsInteger().has_value();
  if (one)
    r.prompts.push_back(integers(q->get("input_ids"), "input_ids"));
  else
    for (const json::Value &p : *ids)
      r.prompts.push_back(integers(&p, "each prompt of input_ids"));
  if (static_cast<int64_t>(r.prompts.size()) > spec.batch)
    throw BadRequest(std::to_string(r.prompts.size()) + " prompts are more than the program's "
                     "max_batch=" + std::to_string(spec.batch));
  for (size_t b = 0; b < r.prompts.size(); ++b) {
    const std::vector<int64_t> &p = r.prompts[b];
    if (p.empty())
      throw BadRequest("prompt " + std::to_string(b) + " has no token");
    if (static_cast<int64_t>(p.size()) > spec.prompt)
      throw BadRequest("prompt " + std::to_string(b) + " has " + std::to_string(p.size()) +
                       " tokens, more than the program's " + std::to_string(spec.prompt) +
                       " (trace_generate's example_ids width)");
    for (int64_t t : p)
      if (t < 0 || t >= spec.vocab)
        throw BadRequest("token id " + std::to_string(t) + " (prompt " + std::to_string(b) +
                         ") is outside the vocabulary [0, " + std::to_string(spec.vocab) + ")");
  }
  if (const json::Value *n = q->get("max_new_tokens")) {
    std::optional<int64_t> v = n->getAsInteger();
    if (!v || *v < 1)
      throw BadRequest("max_new_tokens must be an integer >= 1");
    r.newTokens = *v;
  }
  if (spec.prompt + r.newTokens - 1 > spec.length)
    throw BadRequest(std::to_string(r.newTokens) + " new tokens need more positions than the "
                     "program's max_length=" + std::to_string(spec.length) + ": ask for at "
                     "most " + std::to_string(spec.length - spec.prompt + 1));
  const json::Value *sample = q->get("do_sample");
  if (sample && sample->kind() != json::Value::Null && !sample->getAsBool())
    throw BadRequest("do_sample must be true or false");
  r.sampling.sample = sample && sample->getAsBool().value_or(false);
  if (const json::Value *t = q->get("temperature"); t && t->kind() != json::Value::Null) {
    std::optional<double> v = t->getAsNumber();
    if (!v || !(*v > 0))
      throw BadRequest("temperature must be a number > 0");
    r.sampling.temperature = *v;
  }
  if (const json::Value *k = q->get("top_k"); k && k->kind() != json::Value::Null) {
    std::optional<int64_t> v = k->getAsInteger();
    if (!v || *v < 1)
      throw BadRequest("top_k must be an integer >= 1");
    r.sampling.topK = *v;
  }
  if (const json::Value *p = q->get("top_p"); p && p->kind() != json::Value::Null) {
    std::optional<double> v = p->getAsNumber();
    if (!v || !(*v > 0 && *v <= 1))
      throw BadRequest("top_p must be a number in (0, 1]");
    r.sampling.topP = *v;
  }
  if (const json::Value *s = q->get("seed"); s && s->kind() != json::Value::Null) {
    std::optional<uint64_t> v = s->getAsUINT64();
    if (!v)
      throw BadRequest("seed must be a non-negative integer");
    r.sampling.seed = *v;
  }
  r.eos = q->get("eos_token_id") ? integers(q->get("eos_token_id"), "eos_token_id") : o.eos;
  r.pad = q->getInteger("pad_token_id").value_or(o.pad >= 0 ? o.pad
                                                            : (r.eos.empty() ? 0 : r.eos[0]));
  return r;
}

/// The end-of-sequence and pad tokens of a Hugging Face folder `dir` (its
/// generation_config.json, else its config.json), where the command line
/// gives none.
void modelDefaults(const std::string &dir, std::vector<int64_t> &eos, int64_t &pad) {
  for (const char *name : {"generation_config.json", "config.json"}) {
    std::ifstream in(dir + "/" + name);
    if (!in)
      continue;
    std::stringstream text;
    text << in.rdbuf();
    std::optional<json::Value> parsed = json::parse(text.str());
    const json::Object *config = parsed ? parsed->getAsObject() : nullptr;
    if (!config)
      continue;
    if (eos.empty() && config->get("eos_token_id")) {
      try {
        eos = integers(config->get("eos_token_id"), "eos_token_id");
      } catch (const BadRequest &) {
      }
    }
    if (pad < 0)
      pad = config->getInteger("pad_token_id").value_or(-1);
  }
}

/// The path of the newest version of `key` in `store`.
std::string newest(const std::string &store, const std::string &key) {
  if (isVolumePath(store)) {
    std::vector<int64_t> versions = volumeVersions(store, key);
    if (versions.empty())
      throw std::runtime_error("--refresh-from: the store " + store + " has no key '" + key +
                               "'");
    return store + "/" + key + "/" + stepDirName(versions.back());
  }
  return resolveCheckpoint(storeKeyPath(store, key));
}

double msSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t)
      .count();
}

void emit(const json::Object &line) {
  std::cout << json::print(line) << "\n" << std::flush;
}

} // namespace

void tdx::rt::serveGeneration(Engine &engine, const Options &options,
                              const std::vector<EntryShapes> &shapes) {
  const Spec spec = specOf(shapes);
  Options o = options;
  // Serving a Hugging Face folder: its end-of-sequence and pad tokens.
  if (!o.params.empty() && o.params.rfind("store:", 0) != 0)
    modelDefaults(o.params, o.eos, o.pad);
  Mesh &mesh = engine.mesh();
  const bool root = mesh.rank() == 0;
  std::string refreshKey, loaded;
  if (!o.refreshFrom.empty()) {
    refreshKey = o.refreshFrom.substr(6);
    if (o.params == o.refreshFrom)
      loaded = root ? newest(o.store, refreshKey) : "";
  }
  const int64_t B = spec.batch, P = spec.prompt, L = spec.length;
  for (;;) {
    std::string line;
    if (root && !std::getline(std::cin, line))
      line = "\x04";  // end of input: every rank stops
    line = mesh.broadcastFromRoot(line);
    if (line == "\x04")
      return;
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    GenerationRequest r;
    try {
      r = parseRequest(line, spec, o);
    } catch (const BadRequest &e) {
      if (root) {
        std::optional<json::Value> parsed = json::parse(line);
        const json::Object *q = parsed ? parsed->getAsObject() : nullptr;
        json::Object out{{"error", std::string(e.what())}};
        if (q && q->get("id"))
          out["id"] = *q->get("id");
        emit(out);
      }
      continue;
    }
    if (!refreshKey.empty()) {
      // Between requests: the newest version, if it is not the one loaded.
      auto t0 = std::chrono::steady_clock::now();
      std::string path = mesh.broadcastFromRoot(root ? newest(o.store, refreshKey) : "");
      if (path != loaded) {
        engine.load(path);
        loaded = path;
        if (root)
          emit(json::Object{{"refreshed", path}, {"ms", msSince(t0)}});
      }
    }
    auto start = std::chrono::steady_clock::now();
    const int64_t batch = static_cast<int64_t>(r.prompts.size());
    std::vector<int64_t> ids(B * P, 0), mask(B * L, 1), positions(B * P, 1), last(B, 0);
    for (int64_t b = 0; b < B; ++b) {
      int64_t n = b < batch ? static_cast<int64_t>(r.prompts[b].size()) : 1;
      for (int64_t t = 0; t < P; ++t) {
        bool real = t >= P - n;
        mask[b * L + t] = real;
        if (b < batch && real)
          ids[b * P + t] = r.prompts[b][t - (P - n)];
        positions[b * P + t] = real ? t - (P - n) : 1;
      }
      last[b] = n - 1;
    }
    std::vector<HostTensor> out =
        engine.call({ids.data(), mask.data(), positions.data()}, /*local=*/false, 0);
    std::vector<std::vector<int64_t>> made(static_cast<size_t>(batch));
    std::vector<char> done(static_cast<size_t>(batch), 0);
    double firstMs = 0;
    for (int64_t step = 0;; ++step) {
      std::string tokens;
      if (root) {
        const float *logits = static_cast<const float *>(out.at(0).data);
        std::vector<int64_t> picked(static_cast<size_t>(B), 0);
        for (int64_t b = 0; b < batch; ++b)
          picked[b] = done[b] ? r.pad
                              : pick(logits + b * spec.vocab, spec.vocab, r.sampling,
                                     static_cast<uint64_t>(step), static_cast<uint64_t>(b));
        tokens.assign(reinterpret_cast<const char *>(picked.data()), B * sizeof(int64_t));
      }
      tokens = mesh.broadcastFromRoot(tokens);
      const int64_t *picked = reinterpret_cast<const int64_t *>(tokens.data());
      json::Array row;
      for (int64_t b = 0; b < batch; ++b) {
        made[b].push_back(picked[b]);
        row.push_back(picked[b]);
        done[b] |= std::find(r.eos.begin(), r.eos.end(), picked[b]) != r.eos.end();
      }
      if (step == 0)
        firstMs = msSince(start);
      if (root)
        emit(json::Object{{"id", r.id}, {"step", step}, {"tokens", std::move(row)}});
      bool all = std::all_of(done.begin(), done.end(), [](char d) { return d != 0; });
      if (step + 1 == r.newTokens || all)
        break;
      std::vector<int64_t> next(static_cast<size_t>(B), 0), pos(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) {
        next[b] = b < batch ? picked[b] : 0;
        pos[b] = ++last[b];
      }
      out = engine.call({next.data(), mask.data(), pos.data()}, /*local=*/false, 1);
    }
    if (root) {
      double ms = msSince(start);
      json::Array sequences;
      for (const std::vector<int64_t> &m : made)
        sequences.push_back(json::Array(m.begin(), m.end()));
      int64_t count = static_cast<int64_t>(made.empty() ? 0 : made[0].size()) * batch;
      emit(json::Object{{"id", r.id},
                        {"done", true},
                        {"sequences", std::move(sequences)},
                        {"time_to_first_token_ms", firstMs},
                        {"tokens_per_s", ms > 0 ? count * 1e3 / ms : 0.0}});
    }
  }
}
