// How a configuration key is described: one row per key (section, name, where it is stored,
// type, default, range, meaning), in tables that loading, --set, defaults, validation messages,
// config_write and the key reference (`tally keys`, docs/keys.md) all walk. The recipe's own
// sections live in config.c; each objective declares the section named after it in its own file
// (ObjectiveDef.settings), stored in its slot of Config.objective_settings.
#pragma once
#include <stddef.h>

typedef enum { KEY_INT, KEY_FLOAT, KEY_BOOL, KEY_U64, KEY_STRING, KEY_INT_LIST } KeyType;

// Float bounds that are themselves invalid (a temperature of 0 divides by zero, beta = 1 never
// decays): the range check excludes them.
enum { OPEN_MIN = 1, OPEN_MAX = 2 };

typedef struct {
  const char *section, *key;
  size_t offset;  // into the schema's struct (Config or ModelSpec)
  size_t size;    // bytes of the field: string capacity, or list capacity * sizeof(int)
  KeyType type;
  const char *default_text;  // parsed by the same setter as user input
  double min, max;           // inclusive unless `open` says otherwise; per element for lists;
                             // u64 keys take their whole range
  int open;
  const char *choices;  // "a|b": the only values a string key accepts; NULL = free text
  // One line for the reader of `tally keys`: what the key does, its unit, what 0 or empty means.
  const char *help;
} KeySpec;

// Section and key names are the struct's own member names, stringized so they cannot drift.
#define RECIPE(sec, name)                                              \
  .section = #sec, .key = #name, .offset = offsetof(Config, sec.name), \
  .size = sizeof(((Config *)0)->sec.name)
#define BACKBONE(name)                                                      \
  .section = "backbone", .key = #name, .offset = offsetof(ModelSpec, name), \
  .size = sizeof(((ModelSpec *)0)->name)

// The last argument of each is the key's meaning (KeySpec.help).
#define INT_KEY(at, def, lo, hi, meaning) \
  { at, .type = KEY_INT, .default_text = def, .min = lo, .max = hi, .help = meaning }
#define FLOAT_KEY(at, def, lo, hi, open_ends, meaning)                                   \
  {                                                                                      \
    at, .type = KEY_FLOAT, .default_text = def, .min = lo, .max = hi, .open = open_ends, \
        .help = meaning                                                                  \
  }
#define BOOL_KEY(at, def, meaning) \
  { at, .type = KEY_BOOL, .default_text = def, .help = meaning }
#define U64_KEY(at, def, meaning) \
  { at, .type = KEY_U64, .default_text = def, .help = meaning }
#define TEXT_KEY(at, def, allowed, meaning) \
  { at, .type = KEY_STRING, .default_text = def, .choices = allowed, .help = meaning }
// A list ends at its first 0 (entries are at least 1), so its length is not stored apart.
#define LIST_KEY(at, def, lo, hi, meaning) \
  { at, .type = KEY_INT_LIST, .default_text = def, .min = lo, .max = hi, .help = meaning }

// A key of an objective's own section: `type` is the objective's settings struct, `sec` its
// section (the objective's name).
#define OWN(type, sec, name) \
  .section = #sec, .key = #name, .offset = offsetof(type, name), .size = sizeof(((type *)0)->name)

// The most bytes an objective's settings struct may take (Config reserves a slot for each).
#define CONFIG_SETTINGS_BYTES 256

// An objective's section: its keys (offsets into its settings struct) and the checks between
// them, run by config_validate. `where` names the section for messages.
typedef struct {
  const KeySpec *keys;
  size_t n_keys;
  size_t bytes;  // sizeof the settings struct, <= CONFIG_SETTINGS_BYTES
  int (*validate)(const void *settings, const char *where);
} ConfigSection;

#define CONFIG_SECTION(table, type, check) \
  { table, sizeof table / sizeof table[0], sizeof(type), check }

// The objectives' sections, in the objectives' registry order: names[i] is objective i's name and
// section, sections[i] its keys (NULL: it has none). Config sits below the objectives and does not
// know them, so they are given to it once at startup (objective_register_config), before any
// configuration is read: reading one first, or registering other sections after, is an internal
// error. Registering the same sections again does nothing.
void config_register_objectives(const char *const *names, const ConfigSection *const *sections,
                                int n);

// A backbone family's rows of the model file's [backbone] section (offsets into ModelSpec, which
// every family shares so that one model file format serves them all), and the checks between
// them for images of side `image_size`. `name` is its `[backbone] type`; `help` says what it is.
typedef struct {
  const char *name, *help;
  const KeySpec *keys;
  size_t n_keys;
  int (*validate)(const void *spec, int image_size, const char *where);
} BackboneSection;

#define CONFIG_MAX_BACKBONES 8

// The backbone families' sections, in the backbones' registry order, given once at startup
// (backbone_register_config, which objective_register_config calls) under the same rules as
// the objectives' sections.
void config_register_backbones(const BackboneSection *const *families, int n);
