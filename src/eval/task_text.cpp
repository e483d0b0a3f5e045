// TaskText: the default English pieces and the JSON override.
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/text_file.h"
#include "kvslim/error.h"
#include "kvslim/eval_tasks.h"

namespace kvslim {

namespace {

// Plain, self-contained sentences: none mentions a number, a key or a variable, so no filler can
// be mistaken for an answer.
const char* const kFiller[] = {
    "The grass in the valley was green after the long spring rain.",
    "A small boat drifted slowly along the quiet river.",
    "The baker opened the shop early and the smell of bread filled the street.",
    "Clouds gathered over the hills before the evening storm.",
    "Children played a game of tag in the park near the old library.",
    "The train to the coast left the station on time.",
    "She planted tomatoes and beans in the garden behind the house.",
    "An old clock ticked loudly in the empty hallway.",
    "The fishermen mended their nets while the gulls circled overhead.",
    "Snow covered the mountain pass for most of the winter.",
    "The museum displayed paintings from many different centuries.",
    "A gentle wind moved the curtains of the open window.",
    "The farmer checked the fences around the sheep field.",
    "Lanterns were hung along the bridge for the summer festival.",
    "The students listened carefully while the teacher explained the map.",
    "Fresh apples were stacked in baskets at the market.",
    "The lighthouse keeper climbed the stairs to light the lamp.",
    "A cat slept in a patch of sunlight on the kitchen floor.",
    "The road wound through the forest toward a distant village.",
    "Musicians tuned their instruments before the concert began.",
    "The river rose quickly after the snow melted in the mountains.",
    "A family of ducks crossed the path near the pond.",
    "The carpenter measured the wood twice before cutting it.",
    "Bright flowers lined the walls of the narrow alley.",
    "The old bookshop smelled of paper and dust.",
    "Waves broke against the rocks below the cliffs.",
    "The mail carrier waved to the neighbors on her morning route.",
    "Bees moved from blossom to blossom in the orchard.",
    "The city lights came on one by one as the sun set.",
    "A pot of soup simmered on the stove all afternoon.",
    "The hikers rested on a large flat stone beside the trail.",
    "Rain tapped softly on the roof of the wooden cabin.",
    "The potter shaped a tall vase on the spinning wheel.",
    "Leaves turned red and gold as autumn arrived in the town.",
    "The ferry carried cars and bicycles across the bay.",
    "A young fox watched the farmhouse from the edge of the woods.",
    "The choir practiced the same song until every voice was clear.",
    "Tea was served in small cups on a wooden tray.",
    "The painter mixed blue and yellow to find the right shade of green.",
    "Stars filled the sky above the quiet desert camp.",
    "The shopkeeper swept the steps before opening the door.",
    "A wooden fence separated the garden from the meadow.",
    "The kite rose higher as the wind grew stronger.",
    "Travelers gathered around the fire to share their stories.",
    "The orchard workers picked pears from the lowest branches first.",
    "A narrow staircase led up to the attic of the old house.",
    "The tailor sewed a new button onto the blue coat.",
    "Morning fog hid the harbor until the sun burned it away.",
};

const char* const kAdjectives[] = {
    "amber", "brave", "calm", "clever", "curious", "dusty", "eager", "faint", "fierce", "gentle",
    "golden", "hidden", "humble", "jolly", "lively", "lonely", "lucky", "mellow", "misty", "noble",
    "quiet", "rapid", "rusty", "shiny", "silent", "silver", "sleepy", "swift", "tender", "wild",
};

const char* const kNouns[] = {
    "anchor", "badger", "basket", "beacon", "canyon", "castle", "comet", "compass", "falcon", "feather",
    "garden", "harbor", "island", "lantern", "meadow", "mirror", "orchid", "otter", "pebble", "pepper",
    "pillow", "planet", "puzzle", "rocket", "saddle", "spider", "teapot", "thimble", "violin", "walnut",
};

const char* const kWords[] = {
    "apple", "bridge", "candle", "desert", "engine", "forest", "guitar", "hammer", "jacket", "kettle",
    "ladder", "marble", "needle", "ocean", "pencil", "quarry", "ribbon", "shadow", "ticket", "umbrella",
    "valley", "window", "yogurt", "zipper", "button", "carpet", "dragon", "finger", "glove", "helmet",
    "insect", "jungle", "kitten", "lemon", "magnet", "napkin", "onion", "parrot", "rabbit", "saucer",
    "tunnel", "velvet", "wallet", "blanket", "cactus", "dolphin", "elbow", "fossil", "goblet", "hazel",
    "iris", "jigsaw", "koala", "lizard", "mitten", "nickel", "oyster", "pickle", "quilt", "raisin",
    "sponge", "tulip", "urchin", "vessel", "whistle", "yarn", "acorn", "bucket", "cookie", "drum",
    "flute", "grape", "honey", "igloo", "jelly", "kayak", "lobster", "muffin", "nutmeg", "olive",
    "pumpkin", "radish", "salmon", "tomato", "turnip", "violet", "walrus", "bamboo", "cherry", "daisy",
    "eagle", "ferret", "ginger", "hippo", "ivory", "jaguar", "lemur", "mango", "nectar", "panda",
    "quartz", "robin", "sparrow", "tiger", "turtle", "wizard", "zebra", "beetle", "cobalt", "donkey",
    "ember", "fig", "gravel", "harp", "ink", "jade", "kiwi", "linen", "maple", "noodle",
};

void check_type(const nlohmann::json& v, bool ok, const std::string& label, const std::string& field,
                const char* want) {
  if (!ok) throw Error(fmt::format("{}: field '{}' should be {}, got {}", label, printable(field), want, printable(v.dump())));
}

}  // namespace

TaskText TaskText::defaults() {
  TaskText t;
  t.filler.assign(std::begin(kFiller), std::end(kFiller));
  for (const char* a : kAdjectives)
    for (const char* n : kNouns) t.keys.push_back(fmt::format("{}-{}", a, n));
  t.words.assign(std::begin(kWords), std::end(kWords));
  return t;
}

TaskText TaskText::from_json_text(const std::string& text, const std::string& label) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number too large
    throw Error(fmt::format("{}: not valid JSON ({})", label, printable(e.what())));
  }
  if (!j.is_object()) throw Error(fmt::format("{}: the task text must be a JSON object", label));
  TaskText t = defaults();
  const std::pair<const char*, std::string*> strings[] = {
      {"separator", &t.separator},
      {"needle", &t.needle},
      {"question", &t.question},
      {"answer_prefix", &t.answer_prefix},
      {"question_multi_value", &t.question_multi_value},
      {"answer_prefix_multi_value", &t.answer_prefix_multi_value},
      {"question_multi_query", &t.question_multi_query},
      {"answer_prefix_multi_query", &t.answer_prefix_multi_query},
      {"key_join", &t.key_join},
      {"vt_first", &t.vt_first},
      {"vt_chain", &t.vt_chain},
      {"vt_question", &t.vt_question},
      {"vt_answer_prefix", &t.vt_answer_prefix},
      {"cwe_item", &t.cwe_item},
      {"cwe_question", &t.cwe_question},
      {"cwe_answer_prefix", &t.cwe_answer_prefix},
      {"fwe_question", &t.fwe_question},
      {"fwe_answer_prefix", &t.fwe_answer_prefix},
      {"stop", &t.stop},
      {"key_chars", &t.key_chars},
  };
  const std::pair<const char*, std::vector<std::string>*> lists[] = {
      {"filler", &t.filler}, {"keys", &t.keys}, {"value_words", &t.value_words},
      {"var_names", &t.var_names}, {"words", &t.words},
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    bool done = false;
    for (auto& [name, dst] : strings)
      if (k == name) {
        check_type(v, v.is_string(), label, k, "a string");
        *dst = v.get<std::string>();
        done = true;
      }
    for (auto& [name, dst] : lists)
      if (k == name) {
        check_type(v, v.is_array(), label, k, "an array of strings");
        dst->clear();
        for (const auto& e : v) {
          check_type(e, e.is_string(), label, k, "an array of strings");
          dst->push_back(e.get<std::string>());
        }
        done = true;
      }
    if (k == "value_digits") {
      check_type(v, v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 18, label, k,
                 "an integer in [1, 18]");
      t.value_digits = v.get<int>();
      done = true;
    }
    if (k == "key_length") {
      check_type(v, v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 64, label, k,
                 "an integer in [1, 64]");
      t.key_length = v.get<int>();
      done = true;
    }
    if (!done && !k.empty() && k[0] == '_') done = true;  // "_comment" and the like
    if (!done) throw Error(fmt::format("{}: unknown field '{}'", label, printable(k)));
  }
  return t;
}

TaskText TaskText::from_json_file(const std::string& path) {
  return from_json_text(read_text_file(path, "text_config"), path);
}

}  // namespace kvslim
