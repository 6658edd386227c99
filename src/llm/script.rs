//! OWNER: providers helper (issue 4).
