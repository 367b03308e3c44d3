file(REMOVE_RECURSE
  "CMakeFiles/tally.dir/src/main.c.o"
  "CMakeFiles/tally.dir/src/main.c.o.d"
  "tally"
  "tally.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/tally.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
