# Empty dependencies file for tallylib.
# This may be replaced when dependencies are built.
