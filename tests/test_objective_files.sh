#!/usr/bin/env bash
# An objective lives in its own files: for every objective in the registry (objective_table in
# src/objectives/objective.c), the files under src/ that spell its name as a string literal
# ("moco") may only be
#   - its own files: src/objectives/NAME.c/.h, NAME_*.c/.h, and the file defining objective_NAME;
#   - a loss file it owns: src/objectives/X.c/.h where X.h is included by its own .c file and by
#     no other objective's;
#   - the registry, src/objectives/objective.c;
#   - src/main.c, for the default objective only (the one its help names "(default NAME)").
# Anything else means code outside the objective branches on its name. Each offending line is
# printed as FILE:LINE; the exit code is 1 if there is one.
#
# Usage: tests/test_objective_files.sh [ROOT]   (ROOT: the project's root, default .)
set -euo pipefail
root=${1:-.}
cd "$root"
registry=src/objectives/objective.c

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

[[ -f $registry ]] || fail "$registry not found (run from the project root)"
# The table's entries, &objective_SYMBOL, in registry order.
mapfile -t symbols < <(sed -n '/objective_table\[\] *=/,/};/p' "$registry" |
  grep -o '&objective_[A-Za-z0-9_]*' | sed 's/^&objective_//')
((${#symbols[@]} > 0)) || fail "no objectives found in objective_table ($registry)"

# Each objective's defining file and its .name string.
declare -A name_of file_of
for sym in "${symbols[@]}"; do
  file=$(grep -l "^const ObjectiveDef objective_${sym} *=" src/objectives/*.c) ||
    fail "objective_${sym} (in $registry) is defined in no src/objectives/*.c"
  name=$(sed -n "/^const ObjectiveDef objective_${sym} *=/,/^};/p" "$file" |
    sed -n 's/^ *\.name *= *"\([^"]*\)".*/\1/p')
  [[ -n $name ]] || fail "$file: objective_${sym} has no .name"
  name_of[$sym]=$name
  file_of[$sym]=$file
done

default=$(grep -o '(default [A-Za-z0-9_]*)' src/main.c | head -1 | sed 's/(default \(.*\))/\1/')
[[ -n $default ]] || fail "src/main.c names no default objective ('(default NAME)' in its help)"

# Loss headers an objective's own .c includes, one "SYMBOL HEADER" per line.
includes() {
  grep -o '#include "objectives/[A-Za-z0-9_]*\.h"' "${file_of[$1]}" |
    sed 's/.*objectives\/\([A-Za-z0-9_]*\)\.h"/\1/' | sort -u
}

bad=0
checked=""
for sym in "${symbols[@]}"; do
  name=${name_of[$sym]}
  allowed=("${file_of[$sym]}" "$registry")
  for f in src/objectives/"$name".[ch] src/objectives/"$name"_*.[ch]; do
    [[ -e $f ]] && allowed+=("$f")
  done
  for header in $(includes "$sym"); do
    shared=0
    for other in "${symbols[@]}"; do
      [[ $other != "$sym" ]] && includes "$other" | grep -qx "$header" && shared=1
    done
    if ((!shared)); then
      for f in src/objectives/"$header".c src/objectives/"$header".h; do
        [[ -e $f ]] && allowed+=("$f")
      done
    fi
  done
  [[ $name == "$default" ]] && allowed+=(src/main.c)
  while IFS=: read -r file line text; do
    ok=0
    for a in "${allowed[@]}"; do [[ $file == "$a" ]] && ok=1; done
    if ((!ok)); then
      echo "$file:$line: mentions \"$name\" outside objective $name's files: ${text#"${text%%[![:space:]]*}"}"
      bad=1
    fi
  done < <(grep -rnF --include='*.c' --include='*.h' "\"$name\"" src || true)
  checked+=" $name"
done

if ((bad)); then
  echo "FAILED: an objective's name is spelled outside its own files (see above)" >&2
  exit 1
fi
echo "ok:${checked} (default $default): each named only in its own files"
