file(REMOVE_RECURSE
  "libtallylib.a"
)
