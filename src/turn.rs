//! OWNER: turn machine (issue 3).
