
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/src/core/alloc.c" "CMakeFiles/tallylib.dir/src/core/alloc.c.o" "gcc" "CMakeFiles/tallylib.dir/src/core/alloc.c.o.d"
  "/work/main/src/core/dnnl_ctx.c" "CMakeFiles/tallylib.dir/src/core/dnnl_ctx.c.o" "gcc" "CMakeFiles/tallylib.dir/src/core/dnnl_ctx.c.o.d"
  "/work/main/src/core/error.c" "CMakeFiles/tallylib.dir/src/core/error.c.o" "gcc" "CMakeFiles/tallylib.dir/src/core/error.c.o.d"
  "/work/main/src/core/params.c" "CMakeFiles/tallylib.dir/src/core/params.c.o" "gcc" "CMakeFiles/tallylib.dir/src/core/params.c.o.d"
  "/work/main/src/core/rng.c" "CMakeFiles/tallylib.dir/src/core/rng.c.o" "gcc" "CMakeFiles/tallylib.dir/src/core/rng.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
