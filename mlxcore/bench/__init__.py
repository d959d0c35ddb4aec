"""`mlxchat bench`: the Measures of DESIGN.md, each a ratio from one run."""
