//! OWNER: CLI/scenario work (issue 5): the scenario file format and the `expect` matcher.
