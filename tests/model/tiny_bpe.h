// A tiny hand-written byte-level BPE tokenizer.json for tests that need no
// npm: ids 0..255 are the bytes (id == byte value, pieces in GPT-2's byte
// map: ' ' is "Ġ"), then a few merges, one vocabulary token no merge reaches,
// holes, and added tokens.
//
//   merges by rank       makes   id     merges by rank   makes   id
//   0  h e               he      256    5  o r           or      261
//   1  l l               ll      257    6  Ġw or         Ġwor    262
//   2  he ll             hell    258    7  a a           aa      263
//   3  hell o            hello   259    8  F0 9F         (bytes) 264
//   4  Ġ w               Ġw      260    9  98 80         (bytes) 265
//   "Ġxyz" = 266 (no merge), ids 267..299 unused,
//   <|begin|> 300 special (the post-processor's BOS), <|end|> 301 special,
//   <think> 302 not special, <|pad|> 303 special with lstrip and rstrip.
//
// So "hello world" is [259, 262, 108, 100] and "😀" (F0 9F 98 80) is
// [264, 265], two tokens that each end inside the character.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/tokenizer/hf_tokenizer.h"

namespace kvserve::testing {

inline constexpr char kLlama3SplitRegex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline nlohmann::json TinyBpeTokenizerJson(bool array_merges = false) {
  using json = nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelPiece(std::string(1, static_cast<char>(b)))] = b;
  const std::pair<std::string, std::string> merges[] = {
      {"h", "e"},
      {"l", "l"},
      {"he", "ll"},
      {"hell", "o"},
      {"Ġ", "w"},
      {"o", "r"},
      {"Ġw", "or"},
      {"a", "a"},
      {ByteLevelPiece("\xF0"), ByteLevelPiece("\x9F")},
      {ByteLevelPiece("\x98"), ByteLevelPiece("\x80")},
  };
  json merge_list = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    if (array_merges) {
      merge_list.push_back({a, b});
    } else {
      merge_list.push_back(a + " " + b);
    }
  }
  vocab["Ġxyz"] = id;
  auto added = [](int i, const char* content, bool special, bool strip) {
    return json{{"id", i},         {"content", content},  {"single_word", false}, {"lstrip", strip},
                {"rstrip", strip}, {"normalized", false}, {"special", special}};
  };
  return json{
      {"version", "1.0"},
      {"added_tokens",
       {added(300, "<|begin|>", true, false), added(301, "<|end|>", true, false),
        added(302, "<think>", false, false), added(303, "<|pad|>", true, true)}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kLlama3SplitRegex}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<|begin|>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens",
         {{"<|begin|>", {{"id", "<|begin|>"}, {"ids", {300}}, {"tokens", {"<|begin|>"}}}}}}}},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
}

inline nlohmann::json TinyBpeTokenizerConfig() {
  return {{"bos_token", "<|begin|>"},
          {"eos_token", {{"content", "<|end|>"}, {"__type", "AddedToken"}}},
          {"pad_token", "<|pad|>"},
          {"unk_token", nullptr},
          {"clean_up_tokenization_spaces", true}};
}

// Writes `j` as `dir`/`name`; returns the path.
inline std::string WriteJson(const std::string& dir, const std::string& name,
                             const nlohmann::json& j) {
  std::filesystem::create_directories(dir);
  const std::string path = (std::filesystem::path(dir) / name).string();
  std::ofstream(path, std::ios::binary) << j.dump(2);
  return path;
}

}  // namespace kvserve::testing
