file(REMOVE_RECURSE
  "CMakeFiles/tallylib.dir/src/core/alloc.c.o"
  "CMakeFiles/tallylib.dir/src/core/alloc.c.o.d"
  "CMakeFiles/tallylib.dir/src/core/dnnl_ctx.c.o"
  "CMakeFiles/tallylib.dir/src/core/dnnl_ctx.c.o.d"
  "CMakeFiles/tallylib.dir/src/core/error.c.o"
  "CMakeFiles/tallylib.dir/src/core/error.c.o.d"
  "CMakeFiles/tallylib.dir/src/core/params.c.o"
  "CMakeFiles/tallylib.dir/src/core/params.c.o.d"
  "CMakeFiles/tallylib.dir/src/core/rng.c.o"
  "CMakeFiles/tallylib.dir/src/core/rng.c.o.d"
  "libtallylib.a"
  "libtallylib.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/tallylib.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
