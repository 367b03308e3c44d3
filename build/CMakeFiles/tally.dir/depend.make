# Empty dependencies file for tally.
# This may be replaced when dependencies are built.
