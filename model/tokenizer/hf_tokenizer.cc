#include "model/tokenizer/hf_tokenizer.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/tokenizer/bpe_tokenizer.h"
#include "util/json_file.h"
#include "util/status_macros.h"

namespace kvserve {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the
// other 68 to U+0100.. in byte order.
struct ByteLevelMap {
  std::array<char32_t, 256> to_code_point{};
  std::array<int16_t, 0x144> to_byte{};  // -1: not in the map
  ByteLevelMap() {
    to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_code_point[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_code_point[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteLevelMap& Map() {
  static const ByteLevelMap map;
  return map;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else {  // the map only reaches U+0143
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

constexpr char kTokenizerJson[] = "tokenizer.json";
constexpr char kTokenizerConfig[] = "tokenizer_config.json";
constexpr char kTokenizerModel[] = "tokenizer.model";

// Errors naming the file and the field: Bad for a broken file, Unsupported
// for a kind of tokenizer kvserve does not implement.
class FieldErrors {
 public:
  explicit FieldErrors(std::string path) : path_(std::move(path)) {}
  absl::Status Bad(const std::string& field, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": field '", field, "' ", why));
  }
  absl::Status Unsupported(const std::string& field, const std::string& why) const {
    return absl::UnimplementedError(absl::StrCat(path_, ": field '", field, "' ", why));
  }
  // How an error of another module names the field.
  std::string Name(const std::string& field) const {
    return absl::StrCat(path_, ": field '", field, "'");
  }

 private:
  std::string path_;
};

std::string TypeOf(const json& j) { return j.is_object() ? j.value("type", std::string()) : ""; }

// A token given as "text" or {"content": "text", ...}; "" for null/absent.
absl::StatusOr<std::string> TokenString(const json& config, const char* field,
                                        const FieldErrors& err) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return err.Bad(field, absl::StrCat("is neither a string nor {\"content\": ...}: ", it->dump()));
}

// The first id of an "x_token_id" field (an id or a list of ids).
std::optional<int32_t> FirstTokenId(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return std::nullopt;
  const json* id = &*it;
  if (it->is_array()) {
    if (it->empty()) return std::nullopt;
    id = &(*it)[0];
  }
  if (!id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX) {
    return std::nullopt;
  }
  return static_cast<int32_t>(id->get<int64_t>());
}

// model.vocab and model.merges, taken out of tokenizer.json while it is
// parsed: 400k small JSON nodes would cost more than the rest of the load.
struct VocabAndMerges {
  bool vocab_seen = false, merges_seen = false;
  std::vector<std::pair<std::string, json>> vocab;  // piece, id
  std::vector<json> merges;                         // "a b" or ["a", "b"]
  std::string pending_key;

  // A nlohmann::json parser callback: keeps every other node.
  bool Take(int depth, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    if (depth == 1 && event == E::key) in_model_ = parsed == "model";
    if (depth == 2 && event == E::key && in_model_) {
      field_ = parsed == "vocab" ? kVocab : parsed == "merges" ? kMerges : kOther;
      vocab_seen |= field_ == kVocab;
      merges_seen |= field_ == kMerges;
    }
    if (depth == 1 && (event == E::object_end || event == E::array_end)) in_model_ = false;
    if (depth == 2 && (event == E::object_end || event == E::array_end)) field_ = kOther;
    if (!in_model_ || field_ == kOther || depth < 3) return true;
    if (field_ == kVocab) {
      if (depth != 3) return false;
      if (event == E::key) pending_key = parsed.get<std::string>();
      if (event == E::value || event == E::object_end || event == E::array_end) {
        vocab.emplace_back(std::move(pending_key), std::move(parsed));
      }
      return event == E::object_start || event == E::array_start;  // keep a bad entry whole
    }
    // merges: a string at depth 3, or a small array whose items are at depth 4.
    if (depth == 3 && (event == E::value || event == E::array_end || event == E::object_end)) {
      merges.push_back(std::move(parsed));
      return false;
    }
    return true;
  }

 private:
  enum Field { kOther, kVocab, kMerges };
  bool in_model_ = false;
  Field field_ = kOther;
};

absl::Status ParseModel(const json& model, VocabAndMerges& big, const FieldErrors& err,
                        BpeTokenizerSpec* spec,
                        absl::flat_hash_map<std::string, int32_t>* id_of_piece) {
  if (!model.is_object()) return err.Bad("model", "is not an object");
  const std::string type = TypeOf(model);
  if (!type.empty() && type != "BPE") {
    return err.Unsupported("model.type", absl::StrCat("is '", type, "'; only BPE is supported"));
  }
  if (model.value("byte_fallback", false)) {
    return err.Unsupported("model.byte_fallback",
                           "is true: a SentencePiece-style BPE, not byte-level BPE");
  }
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(field);
    if (it != model.end() && !it->is_null() && *it != "") {
      return err.Unsupported(absl::StrCat("model.", field),
                             absl::StrCat("is ", it->dump(), "; only null or \"\" is supported"));
    }
  }
  if (auto it = model.find("dropout");
      it != model.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0)) {
    return err.Unsupported("model.dropout", absl::StrCat("is ", it->dump(),
                                                         "; BPE dropout is "
                                                         "for training, not serving"));
  }
  auto ignore = model.find("ignore_merges");
  spec->ignore_merges = ignore != model.end() && ignore->is_boolean() && ignore->get<bool>();

  if (!big.vocab_seen || !model.at("vocab").is_object()) {
    return err.Bad("model.vocab", "is missing or not an object");
  }
  spec->vocab.reserve(big.vocab.size());
  id_of_piece->reserve(big.vocab.size());
  for (auto& [piece, id] : big.vocab) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return err.Bad("model.vocab",
                     absl::StrCat("maps '", piece, "' to ", id.dump(), ", not a token id"));
    }
    BpeTokenizerSpec::Token t;
    t.id = static_cast<int32_t>(id.get<int64_t>());
    // A piece outside the byte map decodes to its own UTF-8 text, as in HF.
    if (!ByteLevelBytes(piece, &t.bytes)) t.bytes = piece;
    id_of_piece->emplace(piece, t.id);
    t.piece = std::move(piece);
    spec->vocab.push_back(std::move(t));
  }
  big.vocab.clear();

  if (!big.merges_seen || !model.at("merges").is_array()) {
    return err.Bad("model.merges", "is missing or not a list");
  }
  spec->merges.reserve(big.merges.size());
  std::string left, right;
  for (size_t i = 0; i < big.merges.size(); ++i) {
    const json& m = big.merges[i];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return err.Bad(absl::StrCat("model.merges[", i, "]"),
                       absl::StrCat("is \"", s, "\", not two tokens separated by one space"));
      }
      left.assign(s, 0, space);
      right.assign(s, space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return err.Bad(absl::StrCat("model.merges[", i, "]"),
                     absl::StrCat("is ", m.dump(), ", neither \"a b\" nor [\"a\", \"b\"]"));
    }
    BpeTokenizerSpec::Merge merge;
    for (auto [piece, id] : {std::pair{&left, &merge.left}, std::pair{&right, &merge.right}}) {
      auto it = id_of_piece->find(*piece);
      if (it == id_of_piece->end()) {
        return err.Bad(absl::StrCat("model.merges[", i, "]"),
                       absl::StrCat("names '", *piece, "', which is not in model.vocab"));
      }
      *id = it->second;
    }
    auto merged = id_of_piece->find(left + right);
    if (merged == id_of_piece->end()) {
      return err.Bad(absl::StrCat("model.merges[", i, "]"),
                     absl::StrCat("makes '", left, right, "', which is not in model.vocab"));
    }
    merge.merged = merged->second;
    spec->merges.push_back(merge);
  }
  big.merges.clear();
  return absl::OkStatus();
}

absl::Status ParseNormalizer(const json& n, const std::string& field, const FieldErrors& err,
                             BpeTokenizerSpec* spec) {
  if (n.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(n);
  if (type == "NFC") {
    spec->nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (size_t i = 0; i < n["normalizers"].size(); ++i) {
      KV_RETURN_IF_ERROR(ParseNormalizer(n["normalizers"][i],
                                         absl::StrCat(field, ".normalizers[", i, "]"), err, spec));
    }
    return absl::OkStatus();
  }
  return err.Unsupported(absl::StrCat(field, ".type"),
                         absl::StrCat("is '", type, "'; supported: NFC, Sequence"));
}

absl::Status ParsePreTokenizer(const json& p, const std::string& field, const FieldErrors& err,
                               BpeTokenizerSpec* spec, bool* byte_level) {
  const std::string type = TypeOf(p);
  if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
    for (size_t i = 0; i < p["pretokenizers"].size(); ++i) {
      KV_RETURN_IF_ERROR(ParsePreTokenizer(p["pretokenizers"][i],
                                           absl::StrCat(field, ".pretokenizers[", i, "]"), err,
                                           spec, byte_level));
    }
    return absl::OkStatus();
  }
  BpeTokenizerSpec::PreTokenizeStep step;
  if (type == "ByteLevel") {
    *byte_level = true;
    step.add_prefix_space = p.value("add_prefix_space", true);
    if (p.value("use_regex", true)) {
      KV_ASSIGN_OR_RETURN(
          step.split, RegexSplitter::Compile(kGpt2SplitPattern, /*literal=*/false,
                                             RegexSplitter::Behavior::kIsolated, err.Name(field)));
    }
  } else if (type == "Split") {
    const std::string behavior = p.value("behavior", std::string());
    RegexSplitter::Behavior b;
    if (behavior == "Isolated") {
      b = RegexSplitter::Behavior::kIsolated;
    } else if (behavior == "Removed") {
      b = RegexSplitter::Behavior::kRemoved;
    } else {
      return err.Unsupported(absl::StrCat(field, ".behavior"),
                             absl::StrCat("is '", behavior, "'; supported: Isolated, Removed"));
    }
    if (p.value("invert", false)) {
      return err.Unsupported(absl::StrCat(field, ".invert"), "is true; only false is supported");
    }
    const json pattern = p.value("pattern", json());
    const bool literal = pattern.contains("String");
    const json& source = literal ? pattern["String"] : pattern.value("Regex", json());
    if (!source.is_string()) {
      return err.Bad(absl::StrCat(field, ".pattern"),
                     absl::StrCat("is ", pattern.dump(), ", not {\"Regex\"|\"String\": text}"));
    }
    KV_ASSIGN_OR_RETURN(step.split, RegexSplitter::Compile(source.get<std::string>(), literal, b,
                                                           err.Name(field + ".pattern")));
  } else {
    return err.Unsupported(absl::StrCat(field, ".type"),
                           absl::StrCat("is '", type, "'; supported: ByteLevel, Split, Sequence"));
  }
  spec->pre_tokenizer.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status CheckDecoder(const json& d, const FieldErrors& err) {
  const std::string type = TypeOf(d);
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
    for (size_t i = 0; i < d["decoders"].size(); ++i) {
      const std::string t = TypeOf(d["decoders"][i]);
      if (t != "ByteLevel") {
        return err.Unsupported(absl::StrCat("decoder.decoders[", i, "].type"),
                               absl::StrCat("is '", t, "'; only ByteLevel is supported"));
      }
    }
    return absl::OkStatus();
  }
  return err.Unsupported("decoder", absl::StrCat("is ", d.is_null() ? "null" : "'" + type + "'",
                                                 "; only ByteLevel is supported"));
}

// The id a TemplateProcessing post-processor puts before a single sequence
// (Llama 3.1's <|begin_of_text|>), if any.
std::optional<int32_t> TemplateBos(const json& post) {
  const std::string type = TypeOf(post);
  if (type == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (const json& p : post["processors"]) {
      if (auto id = TemplateBos(p)) return id;
    }
    return std::nullopt;
  }
  if (type != "TemplateProcessing") return std::nullopt;
  const json single = post.value("single", json::array());
  if (!single.is_array() || single.empty() || !single[0].contains("SpecialToken")) {
    return std::nullopt;
  }
  const json name = single[0]["SpecialToken"].value("id", json());
  if (!name.is_string()) return std::nullopt;
  const json ids = post.value("special_tokens", json::object())
                       .value(name.get<std::string>(), json::object())
                       .value("ids", json::array());
  if (!ids.is_array() || ids.empty() || !ids[0].is_number_integer()) return std::nullopt;
  return ids[0].get<int32_t>();
}

// An optional JSON file beside the tokenizer; null when absent.
absl::StatusOr<json> OptionalJson(const fs::path& path) {
  if (!fs::exists(path)) return json();
  KV_ASSIGN_OR_RETURN(json j, ReadJsonFile(path.string()));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not a JSON object"));
  }
  return j;
}

// Special token strings of tokenizer_config.json (null: none).
absl::StatusOr<SpecialTokenStrings> SpecialStrings(const json& config, const FieldErrors& err) {
  SpecialTokenStrings s;
  if (!config.is_object()) return s;
  KV_ASSIGN_OR_RETURN(s.bos_token, TokenString(config, "bos_token", err));
  KV_ASSIGN_OR_RETURN(s.eos_token, TokenString(config, "eos_token", err));
  KV_ASSIGN_OR_RETURN(s.pad_token, TokenString(config, "pad_token", err));
  KV_ASSIGN_OR_RETURN(s.unk_token, TokenString(config, "unk_token", err));
  return s;
}

absl::StatusOr<LoadedTokenizer> LoadSentencePieceFile(const std::string& path,
                                                      const json& tokenizer_config) {
  if (!fs::exists(path)) {
    return absl::NotFoundError(absl::StrCat(path, ": tokenizer file not found"));
  }
  LoadedTokenizer t;
  KV_ASSIGN_OR_RETURN(t.tokenizer, Tokenizer::LoadSentencePiece(path));
  const FieldErrors err((fs::path(path).parent_path() / kTokenizerConfig).string());
  KV_ASSIGN_OR_RETURN(t.special_tokens, SpecialStrings(tokenizer_config, err));
  if (t.special_tokens.bos_token.empty() && t.tokenizer->bos_id() >= 0) {
    t.special_tokens.bos_token = t.tokenizer->IdToPiece(t.tokenizer->bos_id());
  }
  if (t.special_tokens.eos_token.empty() && t.tokenizer->eos_id() >= 0) {
    t.special_tokens.eos_token = t.tokenizer->IdToPiece(t.tokenizer->eos_id());
  }
  return t;
}

}  // namespace

std::string ByteLevelPiece(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(Map().to_code_point[static_cast<unsigned char>(c)], &out);
  return out;
}

bool ByteLevelBytes(std::string_view piece, std::string* bytes) {
  bytes->clear();
  for (size_t i = 0; i < piece.size();) {
    const auto c = static_cast<unsigned char>(piece[i]);
    char32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < piece.size()) {
      cp = (static_cast<char32_t>(c & 0x1F) << 6) | (piece[i + 1] & 0x3F);
      i += 2;
    } else {
      return false;  // 3- and 4-byte characters are all beyond U+0143
    }
    if (cp >= Map().to_byte.size() || Map().to_byte[cp] < 0) return false;
    bytes->push_back(static_cast<char>(Map().to_byte[cp]));
  }
  return true;
}

absl::StatusOr<LoadedTokenizer> LoadTokenizerJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  VocabAndMerges big;
  json j;
  try {
    j = json::parse(text.str(), [&big](int depth, json::parse_event_t event, json& parsed) {
      return big.Take(depth, event, parsed);
    });
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
  const FieldErrors err(path);
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));

  // Refuse kinds we do not implement before building the vocabulary.
  const json null;
  const json& normalizer = j.contains("normalizer") ? j["normalizer"] : null;
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : null;
  const json& decoder = j.contains("decoder") ? j["decoder"] : null;
  BpeTokenizerSpec spec;
  KV_RETURN_IF_ERROR(ParseNormalizer(normalizer, "normalizer", err, &spec));
  bool byte_level = false;
  if (!pre.is_null()) {
    KV_RETURN_IF_ERROR(ParsePreTokenizer(pre, "pre_tokenizer", err, &spec, &byte_level));
  }
  if (!byte_level) {
    return err.Unsupported("pre_tokenizer", "has no ByteLevel step: not a byte-level BPE");
  }
  KV_RETURN_IF_ERROR(CheckDecoder(decoder, err));

  absl::flat_hash_map<std::string, int32_t> id_of_piece;
  if (!j.contains("model")) return err.Bad("model", "is missing");
  KV_RETURN_IF_ERROR(ParseModel(j["model"], big, err, &spec, &id_of_piece));

  absl::flat_hash_map<std::string, int32_t> id_of_added;
  if (auto added = j.find("added_tokens"); added != j.end() && !added->is_null()) {
    if (!added->is_array()) return err.Bad("added_tokens", "is not a list");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a = (*added)[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() > INT32_MAX ||
          !a.contains("content") || !a["content"].is_string() ||
          a["content"].get_ref<const std::string&>().empty()) {
        return err.Bad(field, absl::StrCat("is ", a.dump(),
                                           ", not {\"id\": N, \"content\": "
                                           "\"text\", ...}"));
      }
      BpeTokenizerSpec::AddedToken t;
      t.id = a["id"].get<int32_t>();
      t.content = a["content"].get<std::string>();
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      id_of_added[t.content] = t.id;
      spec.added_tokens.push_back(std::move(t));
    }
  }

  // Beside tokenizer.json: tokenizer_config.json for the token strings,
  // config.json and generation_config.json for ids when strings are absent.
  const fs::path dir = fs::path(path).parent_path();
  KV_ASSIGN_OR_RETURN(json config, OptionalJson(dir / kTokenizerConfig));
  KV_ASSIGN_OR_RETURN(json gen_config, OptionalJson(dir / "generation_config.json"));
  KV_ASSIGN_OR_RETURN(json model_config, OptionalJson(dir / "config.json"));
  const FieldErrors config_err((dir / kTokenizerConfig).string());
  LoadedTokenizer out;
  KV_ASSIGN_OR_RETURN(out.special_tokens, SpecialStrings(config, config_err));

  auto id_of_token = [&](const std::string& s) -> std::optional<int32_t> {
    if (auto it = id_of_added.find(s); it != id_of_added.end()) return it->second;
    if (auto it = id_of_piece.find(s); it != id_of_piece.end()) return it->second;
    return std::nullopt;
  };
  // BOS: the token string, else the token the post-processor's template
  // puts first, else the ids of generation_config.json or config.json; EOS
  // likewise without a template.
  const std::optional<int32_t> template_bos =
      TemplateBos(j.contains("post_processor") ? j["post_processor"] : null);
  auto resolve = [&](const std::string& token, const char* field, std::optional<int32_t> fallback,
                     const char* id_field) -> absl::StatusOr<int32_t> {
    if (!token.empty()) {
      if (auto id = id_of_token(token)) return *id;
      return config_err.Bad(
          field, absl::StrCat("is '", token, "', which is not a token of ", kTokenizerJson));
    }
    if (fallback) return *fallback;
    for (const json* j2 : {&gen_config, &model_config}) {
      if (j2->is_object()) {
        if (auto id = FirstTokenId(*j2, id_field)) return *id;
      }
    }
    return -1;
  };
  KV_ASSIGN_OR_RETURN(spec.bos_id, resolve(out.special_tokens.bos_token, "bos_token", template_bos,
                                           "bos_token_id"));
  KV_ASSIGN_OR_RETURN(spec.eos_id, resolve(out.special_tokens.eos_token, "eos_token", std::nullopt,
                                           "eos_token_id"));

  // Whether BOS is prepended: tokenizer_config.json's add_bos_token when it
  // says, otherwise whether the post-processor's template does.
  if (config.is_object() && config.contains("add_bos_token") &&
      config["add_bos_token"].is_boolean()) {
    spec.add_bos = config["add_bos_token"].get<bool>();
  } else {
    spec.add_bos = template_bos.has_value();
  }

  // additional_special_tokens are special for decoding even when
  // tokenizer.json forgot to say so.
  if (config.is_object() && config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    absl::flat_hash_set<std::string> extra;
    for (const json& t : config["additional_special_tokens"]) {
      if (t.is_string()) extra.insert(t.get<std::string>());
      if (t.is_object() && t.contains("content") && t["content"].is_string()) {
        extra.insert(t["content"].get<std::string>());
      }
    }
    for (auto& t : spec.added_tokens) t.special = t.special || extra.contains(t.content);
  }

  out.tokenizer = std::make_unique<BpeTokenizer>(std::move(spec));
  return out;
}

absl::StatusOr<LoadedTokenizer> LoadTokenizerFile(const std::string& path) {
  if (fs::path(path).extension() == ".json") {
    if (!fs::exists(path)) {
      return absl::NotFoundError(absl::StrCat(path, ": tokenizer file not found"));
    }
    return LoadTokenizerJson(path);
  }
  KV_ASSIGN_OR_RETURN(json config, OptionalJson(fs::path(path).parent_path() / kTokenizerConfig));
  return LoadSentencePieceFile(path, config);
}

absl::StatusOr<LoadedTokenizer> LoadHfDirectoryTokenizer(const std::string& dir) {
  const fs::path d(dir);
  const fs::path sp = d / kTokenizerModel;
  if (fs::exists(d / kTokenizerJson)) {
    absl::StatusOr<LoadedTokenizer> t = LoadTokenizerJson((d / kTokenizerJson).string());
    if (t.ok() || t.status().code() != absl::StatusCode::kUnimplemented || !fs::exists(sp)) {
      return t;
    }
    // Not byte-level BPE (Llama 2, Mistral): the SentencePiece model is the
    // same tokenizer.
  }
  if (!fs::exists(sp)) {
    return absl::NotFoundError(absl::StrCat(
        dir, ": no tokenizer.json or tokenizer.model in the HF directory; pass --tokenizer FILE"));
  }
  KV_ASSIGN_OR_RETURN(json config, OptionalJson(d / kTokenizerConfig));
  return LoadSentencePieceFile(sp.string(), config);
}

}  // namespace kvserve
