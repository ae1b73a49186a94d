"""Project tools that are not part of the installed package (the compatibility matrix)."""
