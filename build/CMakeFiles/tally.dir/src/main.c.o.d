CMakeFiles/tally.dir/src/main.c.o: /work/main/src/main.c \
 /usr/include/stdc-predef.h
