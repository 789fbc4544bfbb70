#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cuboid/core/error.hpp"
#include "cuboid/core/model.hpp"

using cuboid::Activation;
using cuboid::InputError;
using cuboid::ModelSpec;
using cuboid::Normalization;
using nlohmann::json;

namespace {

const std::filesystem::path kRoot = CUBOID_SOURCE_ROOT_DIR;

ModelSpec card(const std::string& file) { return cuboid::load_model(kRoot / "models" / file); }

std::string hf_path(const std::string& file) { return (kRoot / "tests" / "data" / "hf" / file).string(); }

// A valid own-schema card; tests break one field at a time.
json base_card() {
  return json{{"name", "t"},           {"num_layers", 2},   {"hidden_size", 64},
              {"num_attention_heads", 4}, {"vocab_size", 100}, {"seq_length", 32}};
}

// Runs model_from_json and returns the InputError it must throw.
InputError error_of(const json& j, const std::string& source = "test.json") {
  try {
    cuboid::model_from_json(j, source);
  } catch (const InputError& e) {
    return e;
  }
  FAIL("expected an InputError");
  return InputError("", "", "", "");
}

InputError load_error(const std::filesystem::path& path) {
  try {
    cuboid::load_model(path);
  } catch (const InputError& e) {
    return e;
  }
  FAIL("expected an InputError");
  return InputError("", "", "", "");
}

}  // namespace

TEST_CASE("padded_vocab_size rounds up to a multiple of 128 * tp") {
  CHECK(cuboid::padded_vocab_size(50257, 1) == 50304);
  CHECK(cuboid::padded_vocab_size(50257, 8) == 51200);
  CHECK(cuboid::padded_vocab_size(128256, 1) == 128256);  // 1002 * 128: already aligned
  CHECK(cuboid::padded_vocab_size(128256, 8) == 129024);  // 126 * 1024
  CHECK(cuboid::padded_vocab_size(51200, 8) == 51200);
  CHECK(cuboid::padded_vocab_size(1024, 4) == 1024);
  CHECK(cuboid::padded_vocab_size(32000, 1, 64) == 32000);
  CHECK(cuboid::padded_vocab_size(32001, 2, 64) == 32128);
}

TEST_CASE("default_ffn_hidden_size follows Megatron-LM") {
  CHECK(cuboid::default_ffn_hidden_size(4096, Activation::gelu) == 16384);
  // int(4 * 4096 * 2/3 / 64) * 64 = int(170.67) * 64
  CHECK(cuboid::default_ffn_hidden_size(4096, Activation::swiglu) == 10880);
  // int(4 * 768 * 2/3 / 64) * 64 = 32 * 64 (exact)
  CHECK(cuboid::default_ffn_hidden_size(768, Activation::swiglu) == 2048);
  CHECK(cuboid::default_ffn_hidden_size(8192, Activation::swiglu) == 21824);  // int(341.33) * 64

  json j = base_card();
  j["activation"] = "swiglu";
  j["hidden_size"] = 4096;
  j["num_attention_heads"] = 32;
  CHECK(cuboid::model_from_json(j, "t.json").ffn_hidden_size == 10880);
}

TEST_CASE("own card defaults") {
  const ModelSpec m = cuboid::model_from_json(base_card(), "t.json");
  CHECK(m.name == "t");
  CHECK(m.num_kv_heads == 4);
  CHECK(m.head_dim == 16);
  CHECK(m.ffn_hidden_size == 256);
  CHECK(m.activation == Activation::gelu);
  CHECK(m.normalization == Normalization::layernorm);
  CHECK(m.max_position_embeddings == 32);
  CHECK_FALSE(m.tied_embeddings);
  CHECK_FALSE(m.learned_position_embeddings);
  CHECK_FALSE(m.linear_bias);

  // An explicit head_dim lifts the hidden % heads requirement.
  json j = base_card();
  j["hidden_size"] = 60;
  j["head_dim"] = 16;
  const ModelSpec e = cuboid::model_from_json(j, "t.json");
  CHECK(e.head_dim == 16);
  CHECK(e.query_projection_size() == 64);

  // Ignored documentation keys.
  j = base_card();
  j["description"] = "d";
  j["source"] = "s";
  j["_comment"] = "c";
  CHECK_NOTHROW(cuboid::model_from_json(j, "t.json"));
}

TEST_CASE("parameters_per_layer by hand") {
  // h = 64, 4 heads, f = 256, gelu, layernorm, no bias:
  // QKV 64 * 192 + proj 64 * 64 + MLP 2 * 64 * 256 + norms 4 * 64 = 12288 + 4096 + 32768 + 256
  ModelSpec m = cuboid::model_from_json(base_card(), "t.json");
  CHECK(m.parameters_per_layer() == 49408);
  // Biases: QKV 192 + proj 64 + FC1 256 + FC2 64 = 576.
  m.linear_bias = true;
  CHECK(m.parameters_per_layer() == 49408 + 576);
  // GQA with 1 KV head, SwiGLU with f = 128, RMSNorm, no bias:
  // QKV 64 * (64 + 2 * 16) + proj 4096 + MLP 3 * 64 * 128 + norms 2 * 64
  json j = base_card();
  j["num_kv_heads"] = 1;
  j["activation"] = "swiglu";
  j["ffn_hidden_size"] = 128;
  j["normalization"] = "rmsnorm";
  m = cuboid::model_from_json(j, "t.json");
  CHECK(m.parameters_per_layer() == 6144 + 4096 + 24576 + 128);
  // With biases: QKV 96 + proj 64 + gate/up 2 * 128 + down 64 = 480.
  m.linear_bias = true;
  CHECK(m.parameters_per_layer() == 6144 + 4096 + 24576 + 128 + 480);
}

TEST_CASE("Llama-3-8B parameter count") {
  const ModelSpec m = card("llama3-8b.json");
  CHECK(m.num_layers == 32);
  CHECK(m.hidden_size == 4096);
  CHECK(m.num_attention_heads == 32);
  CHECK(m.num_kv_heads == 8);
  CHECK(m.head_dim == 128);
  CHECK(m.ffn_hidden_size == 14336);
  CHECK(m.activation == Activation::swiglu);
  CHECK(m.normalization == Normalization::rmsnorm);
  CHECK(m.vocab_size == 128256);
  CHECK(m.seq_length == 8192);
  CHECK(m.max_position_embeddings == 8192);
  CHECK_FALSE(m.tied_embeddings);
  CHECK_FALSE(m.learned_position_embeddings);
  CHECK_FALSE(m.linear_bias);
  // Per layer: QKV 4096 * (4096 + 2 * 1024) = 25,165,824; proj 4096^2 = 16,777,216;
  // MLP 3 * 4096 * 14336 = 176,160,768; two RMSNorms 8,192 -> 218,112,000.
  CHECK(m.parameters_per_layer() == 218'112'000);
  // 32 layers = 6,979,584,000; embedding and untied LM head 2 * 128256 * 4096 =
  // 1,050,673,152; final norm 4,096 -> 8,030,261,248, the published count.
  // 128256 = 1002 * 128, so tp = 1 needs no vocabulary padding...
  CHECK(m.parameter_count(1) == 8'030'261'248);
  // ...but tp = 8 pads to a multiple of 1024: 129024, adding 2 * 768 * 4096 = 6,291,456.
  CHECK(m.parameter_count(8) == 8'036'552'704);
}

TEST_CASE("Llama-3-70B and Llama-3.1-405B parameter counts") {
  const ModelSpec m70 = card("llama3-70b.json");
  CHECK(m70.num_layers == 80);
  CHECK(m70.hidden_size == 8192);
  CHECK(m70.num_attention_heads == 64);
  CHECK(m70.num_kv_heads == 8);
  CHECK(m70.ffn_hidden_size == 28672);
  CHECK(m70.vocab_size == 128256);
  // Per layer: QKV 8192 * 10240 = 83,886,080; proj 67,108,864; MLP 3 * 8192 * 28672 =
  // 704,643,072; norms 16,384 -> 855,654,400. x80 = 68,452,352,000; embedding + head
  // 2 * 128256 * 8192 = 2,101,346,304; final norm 8,192 -> 70,553,706,496 (~70.55B).
  CHECK(m70.parameters_per_layer() == 855'654'400);
  CHECK(m70.parameter_count() == 70'553'706'496);
  // tp = 8: vocabulary 129024 -> 2 * 129024 * 8192 = 2,113,929,216.
  CHECK(m70.parameter_count(8) == 70'566'289'408);

  const ModelSpec m405 = card("llama3.1-405b.json");
  CHECK(m405.num_layers == 126);
  CHECK(m405.hidden_size == 16384);
  CHECK(m405.num_attention_heads == 128);
  CHECK(m405.num_kv_heads == 8);
  CHECK(m405.ffn_hidden_size == 53248);
  CHECK(m405.seq_length == 8192);
  CHECK(m405.max_position_embeddings == 131072);
  // Per layer: QKV 16384 * 18432 = 301,989,888; proj 268,435,456; MLP 3 * 16384 * 53248
  // = 2,617,245,696; norms 32,768 -> 3,187,703,808. x126 = 401,650,679,808; embedding +
  // head 2 * 128256 * 16384 = 4,202,692,608; final norm 16,384 -> 405,853,388,800.
  CHECK(m405.parameters_per_layer() == 3'187'703'808);
  CHECK(m405.parameter_count() == 405'853'388'800);
}

TEST_CASE("GPT-style cards") {
  // GPT layers with biases and LayerNorm: 12h^2 + 13h per layer.
  const ModelSpec g3 = card("gpt3-175b.json");
  CHECK(g3.num_layers == 96);
  CHECK(g3.hidden_size == 12288);
  CHECK(g3.num_attention_heads == 96);
  CHECK(g3.ffn_hidden_size == 49152);
  CHECK(g3.vocab_size == 50257);
  CHECK(g3.seq_length == 2048);
  CHECK(g3.tied_embeddings);
  CHECK(g3.learned_position_embeddings);
  CHECK(g3.linear_bias);
  // 12 * 12288^2 + 13 * 12288 = 1,812,099,072; x96 = 173,961,510,912; embedding
  // 50304 * 12288 = 618,135,552; positions 2048 * 12288 = 25,165,824; final norm 24,576.
  CHECK(g3.parameters_per_layer() == 1'812'099'072);
  CHECK(g3.parameter_count() == 174'604'836'864);

  const ModelSpec small = card("gpt-small.json");
  CHECK(small.num_layers == 12);
  CHECK(small.hidden_size == 768);
  CHECK(small.num_attention_heads == 12);
  CHECK(small.ffn_hidden_size == 3072);
  CHECK(small.seq_length == 1024);
  // 12 * 7,087,872 = 85,054,464; embedding 50304 * 768 = 38,633,472; positions
  // 786,432; final norm 1,536 -> 124,475,904. Unpadded (50257) it is GPT-2's
  // 124,439,808: 47 padding rows * 768 = 36,096 fewer.
  CHECK(small.parameter_count() == 124'475'904);
  CHECK(small.parameter_count() - 47 * 768 == 124'439'808);

  const ModelSpec g512 = card("gpt-512b.json");
  CHECK(g512.num_layers == 128);
  CHECK(g512.hidden_size == 18432);
  CHECK(g512.num_attention_heads == 144);
  CHECK(g512.head_dim == 128);
  CHECK(g512.ffn_hidden_size == 4 * 18432);
  // 128 * 4,077,103,104 = 521,869,197,312; embedding 51200 * 18432 = 943,718,400;
  // positions 37,748,736; final norm 36,864 -> 522,850,701,312 (~523B).
  CHECK(g512.parameters_per_layer() == 4'077'103'104);
  CHECK(g512.parameter_count() == 522'850'701'312);
}

TEST_CASE("Korthikanti et al. 2022 Table 3 cards") {
  struct Row {
    const char* file;
    std::int64_t heads, hidden, layers, params;
  };
  // Shapes from Table 3 (also in korthikanti2022.csv); vocab 51200 and seq 2048 for all.
  // 22B: 48 * 453,064,704 + 314,572,800 + 12,582,912 + 12,288
  // 530B: 105 * 5,033,431,040 + 1,048,576,000 + 41,943,040 + 40,960 (Narayanan et al.: 529.6B)
  // 1T: 128 * 7,864,652,800 + 1,310,720,000 + 52,428,800 + 51,200 (Narayanan et al.: 1008.0B)
  const Row rows[] = {{"gpt-22b.json", 64, 6144, 48, 22'074'273'792},
                      {"mt-nlg-530b.json", 128, 20480, 105, 529'600'819'200},
                      {"gpt-1t.json", 160, 25600, 128, 1'008'038'758'400}};
  for (const Row& r : rows) {
    CAPTURE(r.file);
    const ModelSpec m = card(r.file);
    CHECK(m.num_attention_heads == r.heads);
    CHECK(m.hidden_size == r.hidden);
    CHECK(m.num_layers == r.layers);
    CHECK(m.ffn_hidden_size == 4 * r.hidden);
    CHECK(m.vocab_size == 51200);
    CHECK(m.seq_length == 2048);
    CHECK(m.activation == Activation::gelu);
    CHECK(m.parameter_count() == r.params);
    // 51200 is a multiple of 1024, so tp = 8 adds no padding.
    CHECK(m.parameter_count(8) == r.params);
  }
}

TEST_CASE("tiny card") {
  const ModelSpec m = card("tiny.json");
  CHECK(m.num_layers == 4);
  CHECK(m.hidden_size == 256);
  CHECK(m.num_attention_heads == 8);
  CHECK(m.head_dim == 32);
  CHECK(m.ffn_hidden_size == 1024);
  CHECK(m.vocab_size == 1024);
  CHECK(m.seq_length == 128);
  CHECK_FALSE(m.tied_embeddings);
  // 4 * (4 * 256^2 + 2 * 256 * 1024 + 4 * 256) + 2 * 1024 * 256 + 512
  CHECK(m.parameter_count() == 3'674'624);
}

TEST_CASE("every shipped card loads, validates, documents its source and round-trips") {
  std::set<std::string> seen;
  for (const auto& entry : std::filesystem::directory_iterator(kRoot / "models")) {
    if (entry.path().extension() != ".json") continue;
    CAPTURE(entry.path().string());
    seen.insert(entry.path().filename().string());
    const ModelSpec m = cuboid::load_model(entry.path());
    CHECK(m.name == entry.path().stem().string());
    CHECK_NOTHROW(cuboid::validate_model(m, entry.path().string()));
    const json raw = json::parse(std::ifstream(entry.path()));
    CHECK(raw.contains("description"));
    CHECK(raw.contains("source"));

    const ModelSpec back = cuboid::model_from_json(cuboid::model_to_json(m), "round-trip");
    CHECK(cuboid::model_to_json(back) == cuboid::model_to_json(m));
    CHECK(back.parameter_count(8) == m.parameter_count(8));
  }
  for (const char* expected : {"gpt3-175b.json", "llama3-8b.json", "llama3-70b.json", "llama3.1-405b.json",
                               "gpt-512b.json", "gpt-small.json", "tiny.json", "gpt-22b.json",
                               "mt-nlg-530b.json", "gpt-1t.json", "mixtral-8x7b.json", "mixtral-8x22b.json",
                               "qwen3-30b-a3b.json", "deepseek-v3.json", "kimi-k2.json"}) {
    CHECK(seen.count(expected) == 1);
  }
}

TEST_CASE("model_to_json writes every field") {
  json j = base_card();
  j["hidden_size"] = 60;
  j["head_dim"] = 16;
  j["num_kv_heads"] = 2;
  j["activation"] = "swiglu";
  j["normalization"] = "rmsnorm";
  j["max_position_embeddings"] = 64;
  j["tied_embeddings"] = true;
  j["learned_position_embeddings"] = true;
  j["linear_bias"] = true;
  const ModelSpec m = cuboid::model_from_json(j, "t.json");
  const json out = cuboid::model_to_json(m);
  CHECK(out.size() == 17);
  CHECK(out["head_dim"] == 16);
  CHECK(out["ffn_hidden_size"] == cuboid::default_ffn_hidden_size(60, Activation::swiglu));
  CHECK(out["activation"] == "swiglu");
  CHECK(out["normalization"] == "rmsnorm");
  CHECK(out["max_position_embeddings"] == 64);
  const ModelSpec back = cuboid::model_from_json(out, "round-trip");
  CHECK(back.head_dim == 16);
  CHECK(back.num_kv_heads == 2);
  CHECK(back.tied_embeddings);
  CHECK(back.learned_position_embeddings);
  CHECK(back.linear_bias);
  CHECK(back.parameter_count() == m.parameter_count());
}

TEST_CASE("dropout: 0.1 unless the card or the HF config says otherwise, written only when it does") {
  const ModelSpec plain = cuboid::model_from_json(base_card(), "t.json");
  CHECK(plain.hidden_dropout == 0.1);
  CHECK(plain.attention_dropout == 0.1);
  CHECK_FALSE(cuboid::model_to_json(plain).contains("hidden_dropout"));
  json j = base_card();
  j["hidden_dropout"] = 0;
  j["attention_dropout"] = 0.05;
  const json out = cuboid::model_to_json(cuboid::model_from_json(j, "t.json"));
  CHECK(out["hidden_dropout"] == 0.0);
  CHECK(out["attention_dropout"] == 0.05);
  j["hidden_dropout"] = 1;
  CHECK(std::string(error_of(j).what()) ==
        "test.json: hidden_dropout: must be in [0, 1) (fix: give the probability, e.g. 0 (none) or 0.1)");
  // Llama 3 trains without dropout (attention_dropout 0.0, no hidden dropout); GPT-2 with 0.1.
  const ModelSpec llama = cuboid::load_model(hf_path("llama3-70b-config.json"));
  CHECK(llama.hidden_dropout == 0.0);
  CHECK(llama.attention_dropout == 0.0);
  CHECK(card("llama3-70b.json").hidden_dropout == 0.0);
  CHECK(cuboid::load_model(hf_path("gpt2-config.json")).attention_dropout == 0.1);
  CHECK(card("gpt3-175b.json").hidden_dropout == 0.1);
}

TEST_CASE("HuggingFace LLaMA config import") {
  const std::string path = hf_path("llama3-70b-config.json");
  const ModelSpec m = cuboid::load_model(path);
  CHECK(m.name == "Meta-Llama-3-70B");
  CHECK(m.num_layers == 80);
  CHECK(m.hidden_size == 8192);
  CHECK(m.num_attention_heads == 64);
  CHECK(m.num_kv_heads == 8);
  CHECK(m.head_dim == 128);
  CHECK(m.ffn_hidden_size == 28672);
  CHECK(m.activation == Activation::swiglu);
  CHECK(m.normalization == Normalization::rmsnorm);
  CHECK(m.vocab_size == 128256);
  CHECK(m.seq_length == 8192);
  CHECK(m.max_position_embeddings == 8192);
  CHECK_FALSE(m.tied_embeddings);
  CHECK_FALSE(m.learned_position_embeddings);
  CHECK_FALSE(m.linear_bias);
  // Same shape as the shipped card.
  json a = cuboid::model_to_json(m);
  json b = cuboid::model_to_json(card("llama3-70b.json"));
  a.erase("name");
  b.erase("name");
  CHECK(a == b);
}

TEST_CASE("HuggingFace GPT-2 config import") {
  const ModelSpec m = cuboid::load_model(hf_path("gpt2-config.json"));
  CHECK(m.name == "gpt2");  // model_type; no _name_or_path in this config
  CHECK(m.num_layers == 12);
  CHECK(m.hidden_size == 768);
  CHECK(m.num_attention_heads == 12);
  CHECK(m.num_kv_heads == 12);
  CHECK(m.head_dim == 64);
  CHECK(m.ffn_hidden_size == 3072);  // n_inner null -> 4h
  CHECK(m.activation == Activation::gelu);
  CHECK(m.normalization == Normalization::layernorm);
  CHECK(m.vocab_size == 50257);
  CHECK(m.seq_length == 1024);
  CHECK(m.max_position_embeddings == 1024);
  CHECK(m.tied_embeddings);
  CHECK(m.learned_position_embeddings);
  CHECK(m.linear_bias);
  CHECK(m.parameter_count() == card("gpt-small.json").parameter_count());
}

TEST_CASE("HuggingFace config variants") {
  const json llama = json::parse(std::ifstream(hf_path("llama3-70b-config.json")));

  SUBCASE("name falls back to the file name") {
    json j = llama;
    j.erase("_name_or_path");
    j.erase("model_type");
    CHECK(cuboid::model_from_hf_config(j, "x/config.json").name == "LlamaForCausalLM");
    j.erase("architectures");
    CHECK(cuboid::model_from_hf_config(j, "ckpt/my-llama/config.json").name == "my-llama");
    CHECK(cuboid::model_from_hf_config(j, "my-llama.json").name == "my-llama");
  }
  SUBCASE("defaults and activations") {
    json j = llama;
    j.erase("num_key_value_heads");
    j.erase("tie_word_embeddings");
    j["hidden_act"] = "gelu_pytorch_tanh";
    j.erase("rms_norm_eps");
    j["layer_norm_eps"] = 1e-5;
    j["head_dim"] = 64;
    const ModelSpec m = cuboid::model_from_json(j, "x.json");
    CHECK(m.num_kv_heads == 64);
    CHECK_FALSE(m.tied_embeddings);
    CHECK(m.activation == Activation::gelu);
    CHECK(m.ffn_hidden_size == 28672);
    CHECK(m.normalization == Normalization::layernorm);
    CHECK(m.head_dim == 64);
    j["hidden_act"] = "relu";
    CHECK(cuboid::model_from_json(j, "x.json").activation == Activation::gelu);
  }
  SUBCASE("GPT-2 with n_ctx only and an explicit n_inner") {
    json j = json::parse(std::ifstream(hf_path("gpt2-config.json")));
    j.erase("n_positions");
    j["n_ctx"] = 2048;
    j["n_inner"] = 1000;
    const ModelSpec m = cuboid::model_from_json(j, "x.json");
    CHECK(m.max_position_embeddings == 2048);
    CHECK(m.ffn_hidden_size == 1000);
  }
  SUBCASE("a dense config with num_experts 1 is dense") {
    json j = llama;
    j["num_experts"] = 1;
    CHECK_NOTHROW(cuboid::model_from_json(j, "x.json"));
  }
}

TEST_CASE("HuggingFace errors name the HF key") {
  const json llama = json::parse(std::ifstream(hf_path("llama3-70b-config.json")));
  SUBCASE("missing required key") {
    json j = llama;
    j.erase("intermediate_size");
    const InputError e = error_of(j, "cfg.json");
    CHECK(e.field() == "intermediate_size");
    CHECK(std::string(e.what()) == "cfg.json: intermediate_size: missing required field (fix: add \"intermediate_size\")");
  }
  SUBCASE("kv heads reported under num_key_value_heads") {
    json j = llama;
    j["num_key_value_heads"] = 6;
    const InputError e = error_of(j, "cfg.json");
    CHECK(e.field() == "num_key_value_heads");
    CHECK(e.problem() == "6 key/value heads do not divide the 64 attention heads");
  }
  SUBCASE("GPT-2 missing n_positions and n_ctx") {
    json j = json::parse(std::ifstream(hf_path("gpt2-config.json")));
    j.erase("n_positions");
    j.erase("n_ctx");
    const InputError e = error_of(j, "g.json");
    CHECK(std::string(e.what()) ==
          "g.json: n_positions: missing required field (fix: add \"n_positions\" (or \"n_ctx\"), the context length)");
  }
  SUBCASE("GPT-2 hidden not divisible by heads") {
    json j = json::parse(std::ifstream(hf_path("gpt2-config.json")));
    j["n_head"] = 7;
    const InputError e = error_of(j, "g.json");
    CHECK(e.field() == "n_embd");
    CHECK(e.problem() == "768 is not divisible by the 7 attention heads");
  }
  SUBCASE("unsupported activation") {
    json j = llama;
    j["hidden_act"] = "tanh";
    const InputError e = error_of(j, "cfg.json");
    CHECK(e.field() == "hidden_act");
    CHECK(e.problem() == "unsupported activation \"tanh\"");
  }
}

TEST_CASE("Mixtral 8x7B parameters by hand, against Mistral's 46.7B total and 12.9B per token") {
  const ModelSpec m = cuboid::load_model(hf_path("mixtral-8x7b-config.json"));
  CHECK(m.moe.num_experts == 8);
  CHECK(m.moe.experts_per_token == 2);
  CHECK(m.moe.expert_ffn_hidden_size == 14336);
  CHECK(m.moe.shared_expert_ffn_hidden_size == 0);
  CHECK(m.moe.moe_layer_count() == 32);
  CHECK_FALSE(m.dense());
  // h 4096, q 4096, kv 1024: attention 4096 * 6144 + 4096 * 4096 = 41,943,040;
  // two RMSNorms 8,192; an expert 3 * 4096 * 14336 = 176,160,768; router 8 * 4096.
  CHECK(m.attention_parameters() == 41'943'040);
  CHECK(m.expert_parameters() == 176'160'768);
  CHECK(m.moe_mlp_parameters() == 8 * 176'160'768 + 32'768);
  // 32 * (41,943,040 + 8,192 + 1,409,318,912) + 2 * 32000 * 4096 + 4096
  CHECK(m.parameter_count() == 46'702'792'704);
  // 32 * (41,943,040 + 8,192 + 2 * 176,160,768 + 32,768) + 262,148,096
  CHECK(m.active_parameter_count() == 12'879'925'248);
}

TEST_CASE("DeepSeek-V3: 671B without the MTP module, MLA's projections by hand") {
  const ModelSpec m = cuboid::load_model(hf_path("deepseek-v3-config.json"));
  CHECK(m.mla.q_lora_rank == 1536);
  CHECK(m.mla.kv_lora_rank == 512);
  CHECK(m.mla.qk_head_dim == 128);
  CHECK(m.mla.qk_rope_head_dim == 64);
  CHECK(m.mla.v_head_dim == 128);
  CHECK(m.head_dim == 192);
  CHECK(m.num_kv_heads == 128);
  CHECK(m.moe.num_experts == 256);
  CHECK(m.moe.shared_expert_ffn_hidden_size == 2048);
  CHECK(m.moe.router_groups == 8);
  CHECK(m.moe.router_group_topk == 4);
  CHECK(m.moe.moe_layer_count() == 58);
  CHECK_FALSE(m.moe.moe_layers[2]);
  CHECK(m.moe.moe_layers[3]);
  CHECK(m.mtp_layers == 1);
  CHECK(m.rope_yarn);
  CHECK(m.rope_scaling_factor == 40.0);
  CHECK(m.rope_mscale == 1.0);
  CHECK(m.rope_mscale_all_dim == 1.0);
  // q: 7168 * 1536 + 1536 + 1536 * 128 * 192 = 48,760,320
  // kv: 7168 * (512 + 64) + 512 + 512 * 128 * 256 = 20,906,496
  // out: 128 * 128 * 7168 = 117,440,512
  CHECK(m.attention_parameters() == 48'760'320 + 20'906'496 + 117'440'512);
  ModelSpec main = m;
  main.mtp_layers = 0;
  CHECK(main.parameter_count() == 671'026'404'352);
  CHECK(m.parameter_count() - main.parameter_count() ==
        m.attention_parameters() + m.moe_mlp_parameters() + 5 * 7168 + 2 * 7168 * 7168);
  CHECK(m.active_parameter_count() == 37'552'282'624);  // DeepSeek: "37B activated"
}

TEST_CASE("Kimi K2: DeepSeek-V3's layer with 64 heads, 384 experts and one dense layer, by hand") {
  const ModelSpec m = cuboid::load_model(kRoot / "models/kimi-k2.json");
  CHECK(m.moe.num_experts == 384);
  CHECK(m.moe.moe_layer_count() == 60);
  CHECK_FALSE(m.moe.moe_layers[0]);
  CHECK(m.moe.router_groups <= 1);
  CHECK(m.mtp_layers == 0);
  // q: 7168 * 1536 + 1536 + 1536 * 64 * 192 = 29,885,952
  // kv: 7168 * (512 + 64) + 512 + 512 * 64 * 256 = 12,517,888
  // out: 64 * 128 * 7168 = 58,720,256
  CHECK(m.attention_parameters() == 29'885'952 + 12'517'888 + 58'720'256);
  // Embedding and head 2 * 163,840 * 7168 + the final norm; 61 layers of
  // attention and two norms (101,138,432); the dense layer's 3 * 7168 *
  // 18,432; 60 MoE layers of the router (7168 * 384), 384 experts and the
  // shared one (3 * 7168 * 2048 = 44,040,192 each).
  const double expert = 3.0 * 7168 * 2048;
  CHECK(expert == 44'040'192.0);
  CHECK(m.parameter_count() == 1'026'408'209'408);  // Moonshot AI: 1T total
  CHECK(static_cast<double>(m.parameter_count()) ==
        2.0 * 163840 * 7168 + 7168 + 61.0 * 101'138'432 + 3.0 * 7168 * 18432 + 60 * (7168.0 * 384 + 385 * expert));
  CHECK(m.active_parameter_count() == 32'861'477'888);  // Moonshot AI: 32B activated
}

TEST_CASE("Qwen MoE configs: experts, shared expert with its gate, the sparse-layer rule") {
  const ModelSpec q3 = cuboid::load_model(hf_path("qwen3-30b-a3b-config.json"));
  CHECK(q3.moe.num_experts == 128);
  CHECK(q3.moe.experts_per_token == 8);
  CHECK(q3.moe.expert_ffn_hidden_size == 768);
  CHECK(q3.moe.shared_expert_ffn_hidden_size == 0);
  CHECK(q3.head_dim == 128);
  CHECK(q3.moe.moe_layer_count() == 48);
  CHECK(q3.parameter_count() == 30'532'110'336);  // Qwen: 30.5B

  const json q2raw = json::parse(std::ifstream(hf_path("qwen2-57b-a14b-config.json")));
  const ModelSpec q2 = cuboid::model_from_json(q2raw, "q2.json");
  CHECK(q2.moe.shared_expert_ffn_hidden_size == 20480);
  CHECK(q2.moe.shared_expert_gate);
  // Router 64 h, 64 experts, the shared expert of 20,480 and its h -> 1 gate.
  CHECK(q2.moe_mlp_parameters() == 64 * 3584 + 64 * 3 * 3584 * 2560 + 3 * 3584 * 20480 + 3584);

  // HF's Qwen2MoeDecoderLayer: sparse when (i + 1) % decoder_sparse_step == 0
  // and i is not in mlp_only_layers.
  json j = q2raw;
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  const ModelSpec stepped = cuboid::model_from_json(j, "q.json");
  CHECK(stepped.moe.moe_layers == std::vector<bool>{false, true, false, false, false, true});
  // The card writes it back as a pattern (no first-dense/frequency form says it).
  const json back = cuboid::model_to_json(stepped);
  CHECK(back["moe"]["layer_pattern"] == json::array({0, 1, 0, 0, 0, 1}));
  CHECK(cuboid::model_from_json(back, "b.json").moe == stepped.moe);
}

TEST_CASE("MoE and MLA cards: the short layer form, round trips, dense cards keep their bytes") {
  json j = base_card();
  j["num_layers"] = 6;
  j["moe"] = {{"num_experts", 4}, {"experts_per_token", 2}, {"expert_ffn_hidden_size", 32},
              {"first_dense_layers", 1}, {"layer_frequency", 2}};
  const ModelSpec m = cuboid::model_from_json(j, "t.json");
  // Megatron's integer --moe-layer-freq after the dense layers: i >= 1 and i % 2 == 0.
  CHECK(m.moe.moe_layers == std::vector<bool>{false, false, true, false, true, false});
  const json back = cuboid::model_to_json(m);
  CHECK(back["moe"]["first_dense_layers"] == 2);  // the first MoE layer is 2: the same pattern
  CHECK(back["moe"]["layer_frequency"] == 2);
  CHECK(cuboid::model_from_json(back, "b.json").moe == m.moe);

  j["mla"] = {{"kv_lora_rank", 16}, {"qk_head_dim", 8}, {"qk_rope_head_dim", 4}, {"v_head_dim", 8}};
  j["mtp_layers"] = 1;
  const ModelSpec a = cuboid::model_from_json(j, "t.json");
  CHECK(a.mla.q_lora_rank == 0);
  CHECK(a.head_dim == 12);
  // q: 64 * 4 * 12; kv: 64 * (16 + 4) + 16 + 16 * 4 * 16; out: 4 * 8 * 64
  CHECK(a.attention_parameters() == 3072 + (1280 + 16 + 1024) + 2048);
  const ModelSpec a2 = cuboid::model_from_json(cuboid::model_to_json(a), "b.json");
  CHECK(a2.mla == a.mla);
  CHECK(a2.mtp_layers == 1);

  // A dense card writes none of the new keys.
  const json dense = cuboid::model_to_json(cuboid::model_from_json(base_card(), "d.json"));
  for (const char* key : {"moe", "mla", "mtp_layers", "rope_scaling_type"}) CHECK_FALSE(dense.contains(key));
}

TEST_CASE("MoE and MLA card errors name the field") {
  const auto moe_card = [] {
    json j = base_card();
    j["moe"] = {{"num_experts", 4}, {"experts_per_token", 2}, {"expert_ffn_hidden_size", 32}};
    return j;
  };
  json j = moe_card();
  j["moe"]["experts_per_token"] = 5;
  CHECK(error_of(j).field() == "moe.experts_per_token");
  j = moe_card();
  j["moe"]["layer_pattern"] = {1, 0, 1};
  CHECK(error_of(j).field() == "moe.layer_pattern");
  j = moe_card();
  j["moe"]["layer_pattern"] = {0, 0};
  CHECK(error_of(j).problem() == "no layer is an MoE layer");
  j = moe_card();
  j["moe"]["layer_pattern"] = {1, 2};
  CHECK(error_of(j).problem() == "has an entry that is not 0 or 1: 2");
  j = moe_card();
  j["moe"]["capacity_factor"] = 5000;
  CHECK(error_of(j).field() == "moe.capacity_factor");
  j = moe_card();
  j["moe"]["shared_expert_gate"] = true;
  CHECK(error_of(j).field() == "moe.shared_expert_gate");
  j = moe_card();
  j["moe"]["router_groups"] = 3;
  j["moe"]["router_group_topk"] = 1;
  CHECK(error_of(j).field() == "moe.router_groups");
  j = moe_card();
  j["moe"]["num_expert"] = 4;  // misspelt
  CHECK(error_of(j).field() == "moe.num_expert");
  j = base_card();
  j["mla"] = {{"kv_lora_rank", 16}, {"qk_head_dim", 8}, {"v_head_dim", 8}};
  j["num_kv_heads"] = 2;
  CHECK(error_of(j).field() == "num_kv_heads");
  j = base_card();
  j["mtp_layers"] = -1;
  CHECK(error_of(j).field() == "mtp_layers");
}

TEST_CASE("HF configs with experts or latent attention of other families are refused, naming the field") {
  const json mixtral = json::parse(std::ifstream(hf_path("mixtral-8x7b-config.json")));
  json j = mixtral;
  j["model_type"] = "phimoe";
  const InputError e = error_of(j, "m.json");
  CHECK(e.field() == "num_local_experts");
  CHECK(e.problem() ==
        "mixture-of-experts (8 experts) in model_type \"phimoe\", which cuboid does not read (it reads mixtral, "
        "qwen2_moe, qwen3_moe and deepseek_v3)");
  for (const char* key : {"num_experts", "n_routed_experts", "moe_num_experts"}) {
    CAPTURE(key);
    json k = mixtral;
    k.erase("num_local_experts");
    k.erase("model_type");
    k[key] = 64;
    CHECK(error_of(k, "m.json").field() == key);
  }
  json v2 = json::parse(std::ifstream(hf_path("deepseek-v3-config.json")));
  v2["model_type"] = "deepseek_v2";
  CHECK(error_of(v2, "v2.json").field() == "n_routed_experts");
  v2.erase("n_routed_experts");
  CHECK(error_of(v2, "v2.json").field() == "kv_lora_rank");
  // YaRN is read for DeepSeek-V3 only.
  json llama = json::parse(std::ifstream(hf_path("llama3-70b-config.json")));
  llama["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  CHECK(error_of(llama, "l.json").field() == "rope_scaling");
  // YaRN terms Megatron-Core's latent attention fixes (no flag sets them) must be its own.
  json v3 = json::parse(std::ifstream(hf_path("deepseek-v3-config.json")));
  v3["rope_scaling"]["beta_fast"] = 1.0;
  const InputError beta = error_of(v3, "v3.json");
  CHECK(beta.field() == "rope_scaling.beta_fast");
  CHECK(beta.problem() == "YaRN's beta_fast 1 where Megatron-Core's multi-latent attention fixes it at 32");
}

TEST_CASE("a card's YaRN attention scale: read, written where not the defaults, refused without YaRN") {
  const ModelSpec ds = cuboid::load_model(kRoot / "models" / "deepseek-v3.json");
  CHECK(ds.rope_mscale == 1.0);
  CHECK(ds.rope_mscale_all_dim == 1.0);
  const json j = cuboid::model_to_json(ds);
  CHECK_FALSE(j.contains("rope_mscale"));  // 1.0, the default
  CHECK(j["rope_mscale_all_dim"] == 1.0);
  CHECK(cuboid::model_from_json(j, "back.json").rope_mscale_all_dim == 1.0);
  json card = j;
  card["rope_mscale_all_dim"] = -1;
  CHECK(error_of(card).field() == "rope_mscale_all_dim");
  card = j;
  card.erase("rope_scaling_type");
  card.erase("rope_scaling_factor");
  CHECK(error_of(card).field() == "rope_mscale_all_dim");
}

TEST_CASE("HF fields the reader looks at are refused when of the wrong type or beyond a model's sizes") {
  const json qwen = json::parse(std::ifstream(hf_path("qwen3-30b-a3b-config.json")));
  // "16" experts without model_type were skipped as no number: planned as a dense model.
  json j = qwen;
  j.erase("model_type");
  j["num_experts"] = "16";
  InputError e = error_of(j, "q.json");
  CHECK(e.field() == "num_experts");
  CHECK(e.problem() == "expected a number, got a string \"16\"");
  j = qwen;
  j["num_experts"] = "16";
  CHECK(error_of(j, "q.json").field() == "num_experts");
  json llama = json::parse(std::ifstream(hf_path("llama3-70b-config.json")));
  for (const auto& [key, value] : {std::pair<const char*, json>{"kv_lora_rank", "512"}, {"rope_scaling", "llama3"},
                                   {"rms_norm_eps", "1e-5"}, {"architectures", "LlamaForCausalLM"}}) {
    CAPTURE(key);
    json k = llama;
    k.erase("_name_or_path");
    k.erase("model_type");
    k[key] = value;
    CHECK(error_of(k, "l.json").field() == key);
  }
  // 2^53 shared experts times moe_intermediate_size 2^11 wrapped to 0: no shared experts.
  json v3 = json::parse(std::ifstream(hf_path("deepseek-v3-config.json")));
  v3["n_shared_experts"] = std::int64_t{1} << 53;
  e = error_of(v3, "v3.json");
  CHECK(e.field() == "n_shared_experts");
  CHECK(e.problem() == "value 9007199254740992 is above the limit of 16777216");
  // One flag per layer is sized by the layer count: refused before it is allocated.
  json mixtral = json::parse(std::ifstream(hf_path("mixtral-8x7b-config.json")));
  mixtral["num_hidden_layers"] = std::int64_t{1} << 40;
  CHECK(error_of(mixtral, "m.json").field() == "num_hidden_layers");
}

TEST_CASE("ALiBi: read from the card, written only when set, exclusive of other positions") {
  json j = base_card();
  CHECK(!cuboid::model_from_json(j, "t.json").alibi);
  CHECK(!cuboid::model_to_json(cuboid::model_from_json(j, "t.json")).contains("alibi"));
  j["alibi"] = true;
  const ModelSpec m = cuboid::model_from_json(j, "t.json");
  CHECK(m.alibi);
  const json out = cuboid::model_to_json(m);
  CHECK(out["alibi"] == true);
  CHECK(cuboid::model_from_json(out, "round-trip").alibi);
  // No parameters of its own.
  CHECK(m.parameter_count() == cuboid::model_from_json(base_card(), "t.json").parameter_count());
  j["learned_position_embeddings"] = true;
  const InputError e = error_of(j);
  CHECK(e.field() == "alibi");
  CHECK(e.problem().find("replaces position embeddings") != std::string::npos);
  json scaled = base_card();
  scaled["alibi"] = true;
  scaled["rope_scaling_factor"] = 8;
  CHECK(error_of(scaled).field() == "alibi");
  json typo = base_card();
  typo["albi"] = true;
  CHECK(error_of(typo).problem() == "unknown field");
  // BLOOM ships with it.
  CHECK(cuboid::load_model("models/bloom-176b.json").alibi);
}

TEST_CASE("card errors carry file, field and fix") {
  SUBCASE("missing field") {
    json j = base_card();
    j.erase("vocab_size");
    const InputError e = error_of(j);
    CHECK(e.source() == "test.json");
    CHECK(e.field() == "vocab_size");
    CHECK(e.problem() == "missing required field");
    CHECK(std::string(e.what()) == "test.json: vocab_size: missing required field (fix: add \"vocab_size\")");
  }
  SUBCASE("wrong type: string for an integer") {
    json j = base_card();
    j["hidden_size"] = "4096";
    const InputError e = error_of(j);
    CHECK(e.field() == "hidden_size");
    CHECK(std::string(e.what()) ==
          "test.json: hidden_size: expected an integer, got a string \"4096\" (fix: give a whole number)");
  }
  SUBCASE("fractional integer") {
    json j = base_card();
    j["num_layers"] = 1.5;
    const InputError e = error_of(j);
    CHECK(e.field() == "num_layers");
    CHECK(std::string(e.what()) == "test.json: num_layers: expected an integer, got 1.5 (fix: give a whole number)");
  }
  SUBCASE("non-positive size") {
    json j = base_card();
    j["hidden_size"] = 0;
    const InputError e = error_of(j);
    CHECK(e.field() == "hidden_size");
    CHECK(std::string(e.what()) == "test.json: hidden_size: must be positive, got 0 (fix: give a value >= 1)");
    j = base_card();
    j["ffn_hidden_size"] = -4;
    CHECK(error_of(j).problem() == "must be positive, got -4");
  }
  SUBCASE("heads not divisible by kv heads") {
    json j = base_card();
    j["num_kv_heads"] = 3;
    const InputError e = error_of(j);
    CHECK(e.field() == "num_kv_heads");
    CHECK(std::string(e.what()) ==
          "test.json: num_kv_heads: 3 key/value heads do not divide the 4 attention heads "
          "(fix: use a key/value head count that divides the attention-head count)");
  }
  SUBCASE("hidden not divisible by heads") {
    json j = base_card();
    j["hidden_size"] = 66;
    const InputError e = error_of(j);
    CHECK(e.field() == "hidden_size");
    CHECK(std::string(e.what()) ==
          "test.json: hidden_size: 66 is not divisible by the 4 attention heads "
          "(fix: use a hidden size that is a multiple of the head count, or give head_dim explicitly)");
  }
  SUBCASE("seq_length above max_position_embeddings") {
    json j = base_card();
    j["max_position_embeddings"] = 16;
    const InputError e = error_of(j);
    CHECK(std::string(e.what()) ==
          "test.json: seq_length: 32 exceeds max_position_embeddings 16 "
          "(fix: lower seq_length or raise max_position_embeddings)");
  }
  SUBCASE("misspelled field") {
    json j = base_card();
    j.erase("num_layers");
    j["num_layer"] = 2;
    const InputError e = error_of(j);
    CHECK(e.field() == "num_layer");
    CHECK(e.problem() == "unknown field");
    CHECK(std::string(e.what()) == "test.json: num_layer: unknown field (fix: did you mean \"num_layers\"?)");
  }
  SUBCASE("unknown field") {
    json j = base_card();
    j["dropout"] = 0.1;
    const InputError e = error_of(j);
    CHECK(e.field() == "dropout");
    CHECK(std::string(e.what()) ==
          "test.json: dropout: unknown field (fix: remove it or check its spelling (see the README's card schema))");
  }
  SUBCASE("unknown activation value") {
    json j = base_card();
    j["activation"] = "relu";
    const InputError e = error_of(j);
    CHECK(e.field() == "activation");
    CHECK(std::string(e.what()) == "test.json: activation: unknown value \"relu\" (fix: use one of gelu|swiglu)");
  }
  SUBCASE("wrong boolean type") {
    json j = base_card();
    j["tied_embeddings"] = "yes";
    CHECK(error_of(j).problem() == "expected true or false, got a string \"yes\"");
  }
  SUBCASE("top level not an object") {
    const InputError e = error_of(json::array({1, 2}));
    CHECK(std::string(e.what()) == "test.json: top level is not a JSON object (fix: wrap the fields in { ... })");
  }
}

TEST_CASE("file errors") {
  SUBCASE("missing file") {
    const std::filesystem::path path = kRoot / "models" / "no-such-model.json";
    const InputError e = load_error(path);
    CHECK(e.source() == path.string());
    CHECK(e.field().empty());
    CHECK(std::string(e.what()) ==
          path.string() + ": file not found (fix: check the path; shipped cards are in models/ and topologies/)");
  }
  SUBCASE("malformed JSON") {
    const std::filesystem::path path =
        std::filesystem::temp_directory_path() / "cuboid-test-model-malformed.json";
    {
      std::ofstream out(path);
      out << "{\"name\": \"x\", \"num_layers\": 2,,}\n";
    }
    const InputError e = load_error(path);
    std::filesystem::remove(path);
    CHECK(e.source() == path.string());
    CHECK(e.field().empty());
    // The parser's own wording follows the prefix; it names line and column.
    CHECK(e.problem().rfind("malformed JSON: ", 0) == 0);
    CHECK(e.problem().find("line 1") != std::string::npos);
    CHECK(e.fix() == "fix the JSON syntax at that position");
    CHECK(std::string(e.what()).rfind(path.string() + ": malformed JSON: ", 0) == 0);
  }
}

TEST_CASE("validate_model on a hand-built spec") {
  ModelSpec m = cuboid::model_from_json(base_card(), "t.json");
  CHECK_NOTHROW(cuboid::validate_model(m, "spec"));
  m.head_dim = 0;
  m.hidden_size = 66;
  try {
    cuboid::validate_model(m, "spec");
    FAIL("expected an InputError");
  } catch (const InputError& e) {
    CHECK(e.field() == "hidden_size");
  }
  m.hidden_size = 64;
  m.num_layers = 0;
  try {
    cuboid::validate_model(m, "spec");
    FAIL("expected an InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) == "spec: num_layers: must be positive, got 0 (fix: give a value >= 1)");
  }
}

TEST_CASE("to_string") {
  CHECK(cuboid::to_string(Activation::gelu) == "gelu");
  CHECK(cuboid::to_string(Activation::swiglu) == "swiglu");
  CHECK(cuboid::to_string(Normalization::layernorm) == "layernorm");
  CHECK(cuboid::to_string(Normalization::rmsnorm) == "rmsnorm");
}
